"""When each collective ran: per-rank spans for ``course_lib.timeline.plot_timeline``.

Defined in chapter 08 (ZeRO and FSDP). Inside a worker::

    from course_lib.sharding import CollectiveClock

    with CollectiveClock(timeline) as clock:      # a course_lib.timeline.Timeline
        loss = model(x).sum(); loss.backward()
    clock.order      # ['all_gather_into_tensor', 'all_gather_into_tensor', ..., 'reduce_scatter_tensor']

Every route to a collective ends in an operator of the ``c10d`` namespace (see
``course_lib.comm_audit``); a ``TorchDispatchMode`` sees each such call, so the clock
times the call itself with ``time.perf_counter`` and records a ``"comm"`` span. On gloo
the calls are synchronous (the op returns when the data is there); with
``async_op=True`` on NCCL a span would cover only the launch.
"""

from __future__ import annotations

import time

from torch.utils._python_dispatch import TorchDispatchMode

from .comm_audit import _describe  # the same names and payloads as CommAudit

__all__ = ["CollectiveClock"]


class CollectiveClock(TorchDispatchMode):
    """Record a ``("comm", name, start, end)`` span in ``timeline`` for every c10d op."""

    def __init__(self, timeline):
        super().__init__()
        self.timeline = timeline
        self.order: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = _describe(func, args)
        if op is None:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        result = func(*args, **(kwargs or {}))
        self.timeline.add("comm", op.name, start, time.perf_counter())
        self.order.append(op.name)
        return result
