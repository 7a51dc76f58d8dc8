"""Per-rank timelines: record what each rank did when, and draw it.

Defined in chapter 03 (DDP), reused by the chapters on communication, overlap and
sharding. A worker records spans; the notebook draws all ranks one above the other::

    from course_lib.timeline import Timeline, plot_timeline

    def worker():
        timeline = Timeline()                  # call after a barrier: t = 0 is "now"
        with timeline.span("compute", "forward"):
            loss = model(x).sum()
        timeline.add("comm", "bucket 0", start, end)   # times from time.perf_counter()
        return timeline.spans

    plot_timeline(launch(worker, world_size=2))

A span is ``(kind, label, start_s, end_s)`` with times in seconds since the
Timeline was made. Spans of kind ``"comm"`` get their own lane under each rank's
compute lane, so communication that overlaps computation is visible as such.
"""

from __future__ import annotations

import contextlib
import time

__all__ = ["Timeline", "plot_timeline", "KIND_COLOURS"]

KIND_COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "step": "#55A868",
    "compute": "#8172B3",
    "comm": "#C44E52",
    "wait": "#BBBBBB",
}


class Timeline:
    """Spans recorded by one rank, in seconds since this object was created."""

    def __init__(self):
        self.origin = time.perf_counter()
        self.spans: list[tuple[str, str, float, float]] = []

    def now(self) -> float:
        """Seconds since the origin."""
        return time.perf_counter() - self.origin

    def add(self, kind: str, label: str, start: float, end: float) -> None:
        """Record a span from two ``time.perf_counter()`` readings."""
        self.spans.append((kind, label, start - self.origin, end - self.origin))

    @contextlib.contextmanager
    def span(self, kind: str, label: str = ""):
        """Record the time the ``with`` block takes."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(kind, label, start, time.perf_counter())


def plot_timeline(spans_per_rank, ax=None, title: str | None = None, unit: str = "ms", colours=None):
    """Draw one row per rank: compute spans on top, ``"comm"`` spans (or ``"comm AXIS"``, coloured by
    axis) in a lane below.

    spans_per_rank: a list (index = rank) of lists of ``(kind, label, start_s, end_s)``.
    Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {**KIND_COLOURS, **(colours or {})}
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    world_size = len(spans_per_rank)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * world_size), dpi=80)
    kinds_seen = []
    for rank, spans in enumerate(spans_per_rank):
        row = world_size - 1 - rank  # rank 0 on top
        for kind, _label, start, end in spans:
            lane = (row + 0.05, 0.35) if kind.split()[0] == "comm" else (row + 0.45, 0.45)  # "comm" or "comm tp"
            ax.broken_barh([(start * scale, max(end - start, 0.0) * scale)], lane,
                           facecolors=colours.get(kind, "#999999"), edgecolor="black", linewidth=0.3)
            if kind not in kinds_seen:
                kinds_seen.append(kind)
    ax.set_yticks([world_size - 1 - r + 0.45 for r in range(world_size)])
    ax.set_yticklabels([f"rank {r}" for r in range(world_size)])
    ax.set_ylim(-0.1, world_size + 0.05)
    ax.set_xlabel(f"time ({unit})")
    if title:
        ax.set_title(title)
    ax.legend(handles=[Patch(color=colours.get(k, "#999999"), label=k) for k in kinds_seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small", frameon=False)
    ax.figure.tight_layout()
    return ax
