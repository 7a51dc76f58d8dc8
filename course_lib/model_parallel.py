"""Instruments for model, pipeline and tensor parallelism: what ran, what was kept, when.

Defined in chapter 09 (model, pipeline and tensor parallelism). Three instruments, each
measuring what actually happened rather than what a function name promises:

* ``CollectiveCounter`` - a ``TorchDispatchMode`` that records every collective and
  point-to-point op that reached the dispatcher on this rank (``dist.all_reduce``,
  ``dist.send``, DTensor's functional collectives, whatever module path called them),
  with the bytes each one carried::

      with CollectiveCounter() as counter:
          y = model(x)
      counter.count("all_reduce"), counter.bytes("send")

* ``SavedTensorMeter`` - ``torch.autograd.graph.saved_tensors_hooks`` that track how
  many bytes autograd holds for backward right now and at most (parameters excluded:
  they exist anyway). A saved tensor is counted from the moment autograd packs it to
  the moment autograd drops it, and a storage saved twice counts once::

      with SavedTensorMeter(model.parameters()) as meter:
          loss = model(x).sum()
          kept = meter.now_bytes        # held for backward after the forward pass
          loss.backward()
      meter.peak_bytes

* pipeline pictures - ``plot_pipeline`` draws per-rank spans ``(kind, label, start_s,
  end_s)`` with the micro-batch written in each box, ``bubble_fraction`` measures the
  idle share of such a timeline, and ``schedule_slider`` shows several measured
  timelines with a slider (and a static rendering for readers without a live kernel).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from .comm_audit import _tensor_bytes  # bytes of a tensor or a (nested) list of them

__all__ = ["CollectiveCounter", "SavedTensorMeter", "plot_pipeline", "bubble_fraction", "schedule_slider"]

# Dispatcher op names (c10d's eager ops and the functional collectives DTensor uses)
# mapped to the names the course uses.
_OP_NAMES = {
    "allreduce_": "all_reduce", "all_reduce": "all_reduce",
    "allgather_": "all_gather", "all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter",
    "broadcast_": "broadcast", "broadcast": "broadcast",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}


class CollectiveCounter(TorchDispatchMode):
    """Records the communication ops that ran on this rank while the mode was active.

    ``calls`` is a list of ``(name, bytes)`` in the order they ran; ``name`` is one of
    ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``send``, ``recv``,
    ... whatever Python route called it. Bytes are those of the first tensor argument
    (the data the op sends or receives on this rank).
    """

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, op = func.namespace, func._opname  # e.g. "c10d", "allreduce_"
        if namespace in ("c10d", "_c10d_functional", "c10d_functional") and op in _OP_NAMES:
            self.calls.append((_OP_NAMES[op], _tensor_bytes(args[0]) if args else 0))
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> int:
        """How many ``name`` ops ran (e.g. ``"all_reduce"``)."""
        return sum(1 for op, _ in self.calls if op == name)

    def bytes(self, name: str) -> int:
        """Bytes carried by all ``name`` ops together."""
        return sum(size for op, size in self.calls if op == name)

    def names(self) -> list[str]:
        """The op names in the order they ran."""
        return [op for op, _ in self.calls]


class _Held:
    """What the pack hook hands to autograd: the tensor, plus bookkeeping when autograd drops it."""

    __slots__ = ("meter", "key", "tensor")

    def __init__(self, meter, key, tensor):
        self.meter, self.key, self.tensor = meter, key, tensor

    def __del__(self):
        self.meter._release(self.key)


class SavedTensorMeter:
    """Bytes autograd holds for backward, measured with ``saved_tensors_hooks``.

    ``now_bytes``: held right now; ``peak_bytes``: the most held at once;
    ``packed``: how many tensors autograd saved in total. Tensors that share a storage
    with one of ``ignore`` (the parameters, usually) are not counted.
    """

    def __init__(self, ignore=()):
        self._ignored = {p.untyped_storage().data_ptr() for p in ignore}
        self._live: dict[int, list[int]] = {}  # storage pointer -> [holders, bytes]
        self.now_bytes = 0
        self.peak_bytes = 0
        self.packed = 0
        self._hooks = None

    def _pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self._ignored:
            return tensor
        self.packed += 1
        entry = self._live.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.now_bytes += entry[1]
            self.peak_bytes = max(self.peak_bytes, self.now_bytes)
        entry[0] += 1
        return _Held(self, key, tensor)

    @staticmethod
    def _unpack(held):
        return held.tensor if isinstance(held, _Held) else held

    def _release(self, key):
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now_bytes -= entry[1]
            del self._live[key]

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False


# --------------------------------------------------------------------------
# Pipeline timelines
# --------------------------------------------------------------------------
def bubble_fraction(spans_per_rank) -> float:
    """Idle share of a pipeline timeline: 1 - (busy time) / (ranks x makespan).

    The makespan runs from the first span's start to the last span's end over all ranks;
    busy time is the total length of all spans.
    """
    starts = [s for spans in spans_per_rank for _, _, s, _ in spans]
    ends = [e for spans in spans_per_rank for _, _, _, e in spans]
    makespan = max(ends) - min(starts)
    busy = sum(e - s for spans in spans_per_rank for _, _, s, e in spans)
    return 1.0 - busy / (len(spans_per_rank) * makespan)


def plot_pipeline(spans_per_rank, ax=None, title: str | None = None):
    """Per-rank timeline (rank 0 on top) with each box labelled by its micro-batch."""
    from .timeline import plot_timeline

    origin = min(s for spans in spans_per_rank for _, _, s, _ in spans)
    shifted = [[(k, label, s - origin, e - origin) for k, label, s, e in spans] for spans in spans_per_rank]
    ax = plot_timeline(shifted, ax=ax, title=title)
    world_size = len(shifted)
    for rank, spans in enumerate(shifted):
        row = world_size - 1 - rank
        for _, label, start, end in spans:
            ax.text((start + end) / 2 * 1e3, row + 0.67, str(label), ha="center", va="center",
                    fontsize=7, color="white")
    return ax


def schedule_slider(runs: dict, describe=None):
    """Measured pipeline timelines, one per key (e.g. the number of micro-batches).

    Draws them all, one under the other (the static rendering, readable without a
    kernel), and returns an ipywidgets slider that redraws one run at a time, or None
    when ipywidgets is not installed. ``describe(key)`` gives each panel's title.
    """
    import matplotlib.pyplot as plt

    describe = describe or (lambda key: str(key))
    keys = list(runs)
    world_size = len(runs[keys[0]])
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, (0.9 + 0.55 * world_size) * len(keys)), dpi=80)
    for ax, key in zip(axes if len(keys) > 1 else [axes], keys):
        plot_pipeline(runs[key], ax=ax, title=describe(key))
    plt.show()
    try:
        import ipywidgets
    except ImportError:
        return None

    def show(index):
        plot_pipeline(runs[keys[index]], title=describe(keys[index]))
        plt.show()

    slider = ipywidgets.IntSlider(value=0, min=0, max=len(keys) - 1, description="run")
    return ipywidgets.interactive(show, index=slider)
