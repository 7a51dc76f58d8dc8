"""Interactive explorers (ipywidgets) with a static rendering for the executed notebook.

Introduced in chapter 01 (``collective_explorer``: a collective and a world size, each
rank's tensor before and after, from a real launch) and chapter 03 (``bucket_explorer``:
DDP's bucket/overlap timeline for a chosen ``bucket_cap_mb``). Each explorer has a
``show_*`` function that draws one setting; the notebook calls it once, so the stored
notebook reads well without a live kernel, and the widget redraws it on every change.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .launcher import launch
from .plotting import show_ranks
from .timeline import plot_timeline

__all__ = ["COLLECTIVES", "run_collective", "show_collective", "collective_explorer",
           "show_bucket_timeline", "bucket_explorer"]


def _start(rank: int, length: int) -> torch.Tensor:
    # Rank r holds 10r, 10r+1, ...: every value says where it came from.
    return torch.arange(length, dtype=torch.float32) + 10 * rank


def _broadcast(t):
    dist.broadcast(t, src=0)
    return t


def _all_reduce(t):
    dist.all_reduce(t)
    return t


def _reduce(t):
    dist.reduce(t, dst=0)
    return t if dist.get_rank() == 0 else None  # only dst's result is defined


def _all_gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out)


def _reduce_scatter(t):
    out = torch.empty(t.numel() // dist.get_world_size())
    dist.reduce_scatter_tensor(out, t)
    return out


def _all_to_all(t):
    out = torch.empty_like(t)
    dist.all_to_all_single(out, t)
    return out


COLLECTIVES: dict[str, Callable] = {
    "broadcast(src=0)": _broadcast, "reduce(dst=0)": _reduce, "all_reduce": _all_reduce,
    "all_gather": _all_gather, "reduce_scatter_tensor": _reduce_scatter, "all_to_all_single": _all_to_all,
}


def _run_on_rank(name: str, length: int):
    before = _start(dist.get_rank(), length)
    return before.clone(), COLLECTIVES[name](before)


def run_collective(name: str, world_size: int, timeout: float = 60):
    """Run one collective for real on ``world_size`` ranks; return (before, after) per rank."""
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; choose one of {sorted(COLLECTIVES)}")
    length = 2 * world_size  # divisible by the world size, as reduce_scatter and all_to_all need
    results = launch(_run_on_rank, world_size=world_size, args=(name, length), show_output=False, timeout=timeout)
    return [before for before, _ in results], [after for _, after in results]


def show_collective(name: str, world_size: int) -> None:
    before, after = run_collective(name, world_size)
    show_ranks(f"{name} on {world_size} ranks", before=before, after=after)


def collective_explorer(world_sizes=(2, 3, 4)):
    """A dropdown of collectives and a world-size slider; each change launches real ranks."""
    import ipywidgets as widgets

    return widgets.interact_manual(show_collective, name=widgets.Dropdown(options=list(COLLECTIVES)),
                                   world_size=widgets.IntSlider(min=min(world_sizes), max=max(world_sizes),
                                                                value=max(world_sizes)))


def show_bucket_timeline(run: Callable[[float], list], bucket_cap_mb: float) -> None:
    """``run(bucket_cap_mb)`` returns per-rank ``{"spans", "buckets"}``; draw and print them."""
    import matplotlib.pyplot as plt

    per_rank = run(bucket_cap_mb)
    plot_timeline([r["spans"] for r in per_rank], title=f"DDP, bucket_cap_mb={bucket_cap_mb}: last step")
    plt.show()
    print(f"bucket_cap_mb={bucket_cap_mb}: {len(per_rank[0]['buckets'])} buckets, values per bucket "
          f"{[n for _, n in per_rank[0]['buckets']]}")


def bucket_explorer(run: Callable[[float], list], caps=(0.25, 1.0, 4.0, 25.0)):
    """A slider over ``bucket_cap_mb`` values; each change trains a few real DDP steps."""
    import ipywidgets as widgets

    return widgets.interact_manual(lambda bucket_cap_mb: show_bucket_timeline(run, bucket_cap_mb),
                                   bucket_cap_mb=widgets.SelectionSlider(options=list(caps), value=1.0))
