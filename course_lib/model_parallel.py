"""Instruments for model, pipeline and tensor parallelism: what was kept, and when.

Defined in chapter 09 (model, pipeline and tensor parallelism). The communication that ran on
a rank is counted with ``course_lib.comm_audit.CommAudit`` (chapter 05); this module adds:

* ``SavedTensorMeter`` - ``torch.autograd.graph.saved_tensors_hooks`` that track how
  many bytes autograd holds for backward right now and at most (parameters excluded:
  they exist anyway). A saved tensor is counted from the moment autograd packs it to
  the moment autograd drops it, and a storage saved twice counts once::

      with SavedTensorMeter(model.parameters()) as meter:
          loss = model(x).sum()
          kept = meter.now_bytes        # held for backward after the forward pass
          loss.backward()
      meter.peak_bytes

  What ``torch.utils.checkpoint`` recomputes in backward is held by checkpoint itself, outside
  these hooks: chapter 09 reads the meter when a recomputation starts and adds what that
  segment saves, measured on its own.

* pipeline pictures - ``plot_pipeline`` draws per-rank spans ``(kind, label, start_s,
  end_s)`` with the micro-batch written in each box, ``bubble_fraction`` measures the
  idle share of such a timeline, and ``schedule_slider`` shows several measured
  timelines with a slider (and a static rendering for readers without a live kernel).
"""

from __future__ import annotations

import torch

__all__ = ["SavedTensorMeter", "plot_pipeline", "bubble_fraction", "schedule_slider"]


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
