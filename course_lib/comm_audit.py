"""Which torch.distributed collectives and point-to-point ops really ran on this rank.

Defined in chapter 05 (ring all-reduce), reused by chapter 01's exercises and by every
check that says "build it from send/recv, not from the built-in collective". Use it
inside a worker (a function run by ``launch`` or ``torchrun``)::

    from course_lib.comm_audit import CommAudit

    def worker():
        x = torch.ones(1000)
        with CommAudit() as audit:
            my_ring_all_reduce(x)             # the code under test
        audit.count("all_reduce")             # 0: no built-in all-reduce ran
        audit.count("send")                   # how many sends ran
        audit.bytes_sent                      # bytes this rank sent with send/isend
        audit.collectives()                   # ['all_reduce', ...]: built-in collectives seen
        audit.calls                           # every op, in order: CommOp(name, bytes, peer, layer)
        return audit                          # it pickles, so the notebook can inspect it

Why two detectors, and not a wrapper around ``dist.all_reduce``: a wrapper sees one
*name*, and the same collective is reachable by many others (an alias,
``dist.distributed_c10d.all_reduce``, ``dist.group.WORLD.allreduce``,
``torch.ops.c10d.allreduce_``, ``torch.distributed._functional_collectives``, DDP's
reducer). All of them funnel into a small set of operators, so ``CommAudit`` watches
those instead:

1. **The dispatcher.** Every route above ends in an operator of the ``c10d`` (or
   ``_c10d_functional``) namespace, called with real tensors. A ``TorchDispatchMode``
   sees each such call with its arguments, so it knows the op, the peer of a send or
   receive, and the bytes (the tensors' ``numel() * element_size()``). These ops are
   recorded with ``layer="dispatcher"``.
2. **The backend.** Calling the backend object directly
   (``group._get_backend(torch.device("cpu")).allreduce([t])``) skips the dispatcher.
   The backend itself reports its work to ``torch.profiler`` as ``gloo:all_reduce``,
   ``gloo:send`` and so on (``nccl:...`` on GPUs), so the audit also runs the profiler
   and adds any kind of backend work that no dispatcher op explains, with
   ``layer="backend"`` and ``bytes=None`` (the event carries no sizes).

What counts as what:

- ``name`` is the torch.distributed function a learner knows: ``all_reduce``,
  ``broadcast``, ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``,
  ``reduce_scatter_tensor``, ``reduce``, ``gather``, ``scatter``, ``all_to_all``,
  ``all_to_all_single``, ``barrier``, ``send``, ``recv`` (``isend``/``irecv`` and
  ``batch_isend_irecv`` are ``send``/``recv`` too). Unknown c10d ops keep their raw
  operator name, so they still count as collectives.
- ``bytes`` is this rank's payload: what a ``send`` sends, what a ``recv`` receives,
  the input a collective contributes. How many bytes a collective puts on the wire
  depends on its algorithm, which the audit cannot see.
- ``peer`` is the destination of a send and the source of a receive (a rank in the
  group the op ran on), else ``None``.
- Backend work is attributed by kind: gloo runs ``reduce_scatter`` as all-reduces, so
  ``gloo:all_reduce`` events next to a dispatcher ``reduce_scatter`` are explained by it.
  One direct backend call made next to a dispatcher call of the same kind is therefore
  not counted twice (nor at all): the audit says *whether* a kind ran, exactly how many
  times only for the dispatcher layer.

Why ``audit.calls`` and not ``audit.ops``: cloudpickle, which sends a notebook's function
to the workers, treats any attribute name the function reads as a possible submodule of
the modules it uses, so a worker that reads ``x.ops`` and uses ``torch`` tries to pickle
``torch.ops`` and fails ("cannot pickle '_Ops' object").

Limits, stated so nobody relies on more: both detectors watch the thread that entered
the ``with`` block (the dispatch mode is thread-local, and so is the profiler's recording
of the backend's events), so a collective called from another Python thread is not seen;
the profiler cannot run inside another active profiler (``CommAudit(backend_events=False)``
then audits the dispatcher alone); the profiler's start and stop messages, which Kineto
writes to the process's stderr, are silenced for those two moments only.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CommAudit", "CommOp", "POINT_TO_POINT"]

POINT_TO_POINT = frozenset({"send", "recv"})

# c10d operator -> (the torch.distributed name, index of the argument holding this rank's payload)
_C10D_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0),
    "broadcast_": ("broadcast", 0),
    "allgather_": ("all_gather", 1),
    "_allgather_base_": ("all_gather_into_tensor", 1),
    "allgather_coalesced_": ("all_gather_coalesced", 1),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", 1),
    "reduce_scatter_": ("reduce_scatter", 1),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", 1),
    "reduce_": ("reduce", 0),
    "gather_": ("gather", 1),
    "scatter_": ("scatter", 1),
    "alltoall_": ("all_to_all", 1),
    "alltoall_base_": ("all_to_all_single", 1),
    "barrier": ("barrier", None),
    "monitored_barrier_": ("monitored_barrier", None),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
}
# _c10d_functional operator -> torch.distributed name (payload: the first argument)
_FUNCTIONAL_OPS = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced_": "all_reduce_coalesced",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "all_gather_into_tensor_out": "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all_single": "all_to_all_single",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
_FUNCTIONAL_BOOKKEEPING = {"wait_tensor", "_wrap_tensor_autograd"}

# Which kind of backend work (the part after "gloo:") each name may cause.
_BACKEND_KIND = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "reduce_scatter": "all_reduce", "reduce_scatter_tensor": "all_reduce",
    "reduce_scatter_tensor_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "send": "send", "recv": "recv",
}
_BACKEND_EVENT = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):(\w+)$")


@dataclass(frozen=True)
class CommOp:
    """One communication op that ran on this rank (see the module docstring)."""

    name: str               # "all_reduce", "send", ...
    bytes: int | None       # this rank's payload; None where it cannot be known
    peer: int | None = None  # destination of a send, source of a recv
    layer: str = "dispatcher"  # "dispatcher" or "backend"

    @property
    def is_point_to_point(self) -> bool:
        return self.name in POINT_TO_POINT


def _tensor_bytes(value) -> int:
    """Bytes of every tensor in a tensor, a list of them, or a list of lists."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _describe(func, args) -> CommOp | None:
    """The CommOp for a dispatcher call, or None for ops that do not communicate."""
    namespace, op = func.namespace, func._schema.name.split("::")[-1]
    if namespace == "c10d":
        name, payload = _C10D_OPS.get(op, (op, 0))
        peer = None
        if name in POINT_TO_POINT and op != "recv_any_source_":
            peer = int(args[2])
        size = 0 if payload is None else _tensor_bytes(args[payload]) if len(args) > payload else 0
        return CommOp(name, size, peer)
    if namespace == "_c10d_functional":
        if op in _FUNCTIONAL_BOOKKEEPING:
            return None
        return CommOp(_FUNCTIONAL_OPS.get(op, op), _tensor_bytes(args[0]) if args else 0)
    return None


class _DispatcherWatch(TorchDispatchMode):
    """Records every c10d operator called on this thread, with its arguments' sizes."""

    def __init__(self, ops: list):
        super().__init__()
        self._ops = ops
        self.in_flight = []  # outputs of functional collectives, which run on after they return

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional"):
            op = _describe(func, args)
            if op is not None:
                self._ops.append(op)
                if func.namespace == "_c10d_functional":
                    self.in_flight.append(result)
        return result

    def wait_for_in_flight(self) -> None:
        """Wait until every functional collective started in the block has finished.

        DTensor's collectives return at once and finish on the backend's thread, which reports
        to the profiler as it goes; stopping the profiler under a running collective corrupts
        memory (a rank died of it in about 1 launch in 25). Waiting here changes no result: the
        program waits for the same collectives when it first reads their outputs.
        """
        for result in self.in_flight:
            for tensor in result if isinstance(result, (list, tuple)) else [result]:
                if isinstance(tensor, torch.Tensor):
                    torch.ops._c10d_functional.wait_tensor(tensor)
        self.in_flight.clear()


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the C-level stderr for a moment (Kineto prints on profiler start/stop)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass
class CommAudit:
    """Context manager recording the communication that ran on this rank inside it.

    ``CommAudit(backend_events=True)``: also run ``torch.profiler`` to catch calls that
    skip the dispatcher. After the ``with`` block: ``calls``, ``count(name)``,
    ``collectives()``, ``sends``, ``recvs``, ``bytes_sent``, ``bytes_received``,
    ``backend_work`` (a Counter of backend event kinds) and ``summary()``.
    """

    backend_events: bool = True
    calls: list = field(default_factory=list)
    backend_work: Counter = field(default_factory=Counter)

    def __post_init__(self):
        self._mode = None
        self._profiler = None

    # -- recording ---------------------------------------------------------
    def __enter__(self) -> "CommAudit":
        self.calls.clear()
        self.backend_work.clear()
        if self.backend_events:
            if torch.autograd.profiler._is_profiler_enabled:
                raise RuntimeError(
                    "CommAudit cannot start torch.profiler inside another active profiler; "
                    "use CommAudit(backend_events=False) there, or audit outside the profiler")
            self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with _quiet_stderr():
                self._profiler.__enter__()
        self._mode = _DispatcherWatch(self.calls)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc_info):
        self._mode.__exit__(*exc_info)
        self._mode.wait_for_in_flight()  # before the profiler stops (see wait_for_in_flight)
        self._mode = None
        if self._profiler is not None:
            with _quiet_stderr():
                self._profiler.__exit__(*exc_info)
            for event in self._profiler.events():
                match = _BACKEND_EVENT.match(event.name)
                if match:
                    self.backend_work[match.group(2)] += 1
            self._profiler = None
            self._add_unexplained_backend_work()
        return False

    def _add_unexplained_backend_work(self) -> None:
        explained = {_BACKEND_KIND.get(op.name, op.name) for op in self.calls}
        for kind, times in sorted(self.backend_work.items()):
            if kind not in explained:
                self.calls.extend(CommOp(kind, None, None, "backend") for _ in range(times))

    def __getstate__(self):  # an audit travels back from a worker; the live objects do not
        state = dict(self.__dict__)
        state["_mode"] = state["_profiler"] = None
        return state

    # -- reading -------------------------------------------------------------
    def count(self, name: str) -> int:
        """How many ops called ``name`` ran ("all_reduce", "send", "recv", ...)."""
        return sum(op.name == name for op in self.calls)

    def collectives(self) -> list[str]:
        """Names of the collectives that ran (everything but send/recv), sorted, once each."""
        return sorted({op.name for op in self.calls if not op.is_point_to_point})

    @property
    def sends(self) -> list[CommOp]:
        return [op for op in self.calls if op.name == "send"]

    @property
    def recvs(self) -> list[CommOp]:
        return [op for op in self.calls if op.name == "recv"]

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank sent point-to-point (sends the backend ran directly are not sized)."""
        return sum(op.bytes or 0 for op in self.sends)

    @property
    def bytes_received(self) -> int:
        return sum(op.bytes or 0 for op in self.recvs)

    def summary(self) -> str:
        """One line: each op name with its count, and the point-to-point bytes."""
        counts = Counter(op.name for op in self.calls)
        parts = [f"{name} x{counts[name]}" for name in sorted(counts)] or ["no communication"]
        return f"{', '.join(parts)}; sent {self.bytes_sent} B, received {self.bytes_received} B"
