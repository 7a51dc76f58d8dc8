"""Bytes a rank really holds, and the ZeRO memory calculator.

Defined in chapter 08 (ZeRO and FSDP). CPU tensors have no allocator counters like
``torch.cuda.memory_allocated``, so what a rank holds is counted from the tensors it
keeps: the bytes of their storages, each storage once (views share one)::

    from course_lib.memory import held_bytes, optimizer_state_bytes, format_bytes

    held_bytes(model.parameters())        # parameters (DTensor shards count locally)
    held_bytes(p.grad for p in model.parameters())
    optimizer_state_bytes(optimizer)      # Adam: exp_avg + exp_avg_sq

The calculator takes the formula as an argument, so the notebook writes the formula
itself and the library only draws::

    memory_table(per_device_bytes, [(7.5e9, 64)], stages=[0, 1, 2, 3])
    memory_calculator(per_device_bytes)   # ipywidgets sliders (needs a live kernel)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["held_bytes", "optimizer_state_bytes", "format_bytes", "memory_table",
           "memory_calculator", "draw_memory_bars", "STAGE_NAMES"]

STAGE_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # A DTensor (FSDP2's sharded parameter) holds only its local shard on this rank.
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def held_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the storages behind ``tensors`` (None skipped, each storage counted once)."""
    seen, total = set(), 0
    for tensor in tensors:
        if tensor is None:
            continue
        storage = _local(tensor).untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else id(storage)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-element state (Adam's two moments, SGD's momentum).

    Zero-dimensional entries such as Adam's ``step`` counter (4 bytes per tensor, not per
    element) are left out: they do not grow with the model.
    """
    return held_bytes(value for state in optimizer.state.values() for value in state.values()
                      if isinstance(value, torch.Tensor) and value.dim() > 0)


def format_bytes(n: float) -> str:
    """Decimal units, as the ZeRO paper writes them: 120.0 GB, 31.4 GB, 512 B."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def memory_table(formula: Callable, cases, stages=(0, 1, 2, 3), k: int = 12) -> list[list[str]]:
    """Print (and return) per-device bytes ``formula(psi, n, stage, k)`` for each (psi, n) case."""
    header = ["parameters", "ranks"] + [STAGE_NAMES[s] for s in stages]
    rows = [[f"{psi:.3g}", str(n)] + [format_bytes(formula(psi, n, s, k)) for s in stages]
            for psi, n in cases]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    return rows


def draw_memory_bars(parts_per_case: dict[str, dict[str, float]], title: str, unit: float = 1e9,
                     unit_name: str = "GB", ax=None):
    """Stacked bars: one bar per case, one colour per part (parameters, gradients, optimizer)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3), dpi=80)
    colours = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868"}
    names = list(parts_per_case)
    bottom = [0.0] * len(names)
    for part, colour in colours.items():
        heights = [parts_per_case[name].get(part, 0) / unit for name in names]
        ax.bar(names, heights, bottom=bottom, color=colour, label=part)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"per device ({unit_name})")
    ax.set_title(title)
    ax.legend(fontsize="small", frameon=False)
    ax.figure.tight_layout()
    return ax


def memory_calculator(formula: Callable, parts: Callable | None = None):
    """ipywidgets explorer over ``formula(psi, n, stage, k)``: parameters, ranks, stage, K.

    ``parts(psi, n, stage, k)`` may return {"parameters": ..., "gradients": ..., "optimizer": ...}
    to draw the split. Returns the widget box (display it as a cell's last expression).
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    psi = widgets.FloatLogSlider(value=7.5e9, base=10, min=6, max=12, step=0.05, description="parameters")
    ranks = widgets.IntSlider(value=64, min=1, max=1024, description="ranks N")
    stage = widgets.Dropdown(options=[(name, s) for s, name in STAGE_NAMES.items()], value=3, description="stage")
    k = widgets.IntSlider(value=12, min=0, max=24, description="K")
    out = widgets.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            total = formula(psi.value, ranks.value, stage.value, k.value)
            print(f"{STAGE_NAMES[stage.value]}: {format_bytes(total)} of model states per device")
            if parts is not None:
                cases = {STAGE_NAMES[s]: parts(psi.value, ranks.value, s, k.value) for s in STAGE_NAMES}
                draw_memory_bars(cases, f"{psi.value:.3g} parameters on {ranks.value} ranks, K={k.value}")
                plt.show()

    for control in (psi, ranks, stage, k):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([psi, ranks]), widgets.HBox([stage, k]), out])
