"""Interactive explorers (ipywidgets) with a static rendering for the executed notebook.

Introduced in chapter 01 (``collective_explorer``: a collective and a world size, each
rank's tensor before and after, from a real launch) and chapter 03 (``bucket_explorer``:
DDP's bucket/overlap timeline for a chosen ``bucket_cap_mb``). Each explorer has a
``show_*`` function that draws one setting; the notebook calls it once, so the stored
notebook reads well without a live kernel, and the widget redraws it on every change.

Chapter 13 adds ``layout_planner`` (``show_plan``): the layouts of a model that fit a cluster,
ranked by predicted step time (``course_lib.scale.plan_layouts``); arithmetic only, no launch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .launcher import launch
from .plotting import show_ranks
from .timeline import plot_timeline

__all__ = ["COLLECTIVES", "run_collective", "show_collective", "collective_explorer",
           "show_bucket_timeline", "bucket_explorer", "PLANNER_MODELS", "show_plan", "layout_planner"]


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


# ---- chapter 13: the layout planner (course_lib.scale.plan_layouts), one setting printed, the widget redraws it.
PLANNER_MODELS = {   # chapter 13's block (4d² + 2·d·ffn weights a layer), at widths of common open models
    "1.3B (24 x 2048)": dict(layers=24, d_model=2048, heads=16, ffn=8192, vocab=32000),
    "6.7B (32 x 4096)": dict(layers=32, d_model=4096, heads=32, ffn=16384, vocab=32000),
    "13B (40 x 5120)": dict(layers=40, d_model=5120, heads=40, ffn=20480, vocab=32000),
    "59B (80 x 8192)": dict(layers=80, d_model=8192, heads=64, ffn=28672, vocab=32000),
}


def show_plan(model: str, seq_len: int, global_batch: int, gpus: int, gpus_per_node: int, memory_gb: float,
              tflops: float, intra_gb_s: float, inter_gb_s: float, top: int = 8) -> list:
    """Print the layouts that fit, fastest predicted step first (course_lib.scale.plan_layouts); return them."""
    from .scale import Cluster, Decoder, plan_layouts, plan_table

    decoder = Decoder(**PLANNER_MODELS[model])
    cluster = Cluster(gpus=gpus, gpus_per_node=gpus_per_node, memory_bytes=memory_gb * 1e9, flops_per_s=tflops * 1e12,
                      intra_bytes_per_s=intra_gb_s * 1e9, inter_bytes_per_s=inter_gb_s * 1e9)
    rows = plan_layouts(decoder, cluster, seq_len, global_batch)
    print(f"{model}: {decoder.n_params / 1e9:.2f}B parameters, {global_batch} sequences of {seq_len} tokens a step; "
          f"{gpus} GPUs ({gpus_per_node} a node) of {memory_gb:g} GB, {tflops:g} TFLOP/s, links {intra_gb_s:g} GB/s "
          f"in a node and {inter_gb_s:g} GB/s between nodes, per GPU")
    if rows:
        print(f"{len(rows)} layouts fit; the fastest {min(top, len(rows))}:")
        print(plan_table(rows, top))
    else:
        print("no layout fits: more GPUs, more memory per GPU, or shorter sequences")
    return rows


def layout_planner():
    """Sliders for the model, the batch and the cluster; each change ranks the layouts again (arithmetic only)."""
    import ipywidgets as widgets

    def powers(low, high):
        return [2**k for k in range(low, high + 1)]

    return widgets.interact_manual(
        show_plan, model=widgets.Dropdown(options=list(PLANNER_MODELS), value="59B (80 x 8192)"),
        seq_len=widgets.SelectionSlider(options=powers(10, 15), value=4096),
        global_batch=widgets.SelectionSlider(options=powers(4, 11), value=256),
        gpus=widgets.SelectionSlider(options=powers(3, 12), value=64),
        gpus_per_node=widgets.SelectionSlider(options=[4, 8], value=8),
        memory_gb=widgets.SelectionSlider(options=[24, 40, 80, 141], value=80),
        tflops=widgets.FloatSlider(min=50, max=1000, step=50, value=400),
        intra_gb_s=widgets.FloatSlider(min=25, max=900, step=25, value=450),
        inter_gb_s=widgets.FloatSlider(min=1, max=100, step=1, value=50), top=widgets.fixed(8))
