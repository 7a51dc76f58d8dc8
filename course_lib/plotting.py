"""Pictures of what each rank holds.

Defined in chapter 01 (collectives), reused by the chapters that move tensors between
ranks (ring all-reduce, ZeRO/FSDP sharding)::

    from course_lib.plotting import show_ranks
    show_ranks("all_reduce (SUM)", before=inputs, after=results)

Each keyword is one column of the picture (``before``, ``after``, ...) and holds one
entry per rank: a 1-D or 2-D tensor, or ``None`` when that rank holds nothing there.
Every rank is a row; every element is a coloured cell with its value written in it.
All cells share one colour scale, so equal values have equal colours across ranks.
The same numbers are also printed as text, because a notebook test compares text,
not images.
"""

from __future__ import annotations

import math

import torch

__all__ = ["format_values", "show_ranks"]


def _as_rows(entry) -> torch.Tensor | None:
    """A rank's entry as a 2-D float tensor (a 1-D tensor becomes one row), or None."""
    if entry is None:
        return None
    tensor = torch.as_tensor(entry).detach().cpu().double()
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    if tensor.dim() == 1:
        tensor = tensor.reshape(1, -1)
    if tensor.dim() != 2:
        raise ValueError(f"show_ranks draws 1-D or 2-D tensors, got shape {tuple(tensor.shape)}")
    return tensor


def _format_number(value: float) -> str:
    if math.isfinite(value) and float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.3g}"


def format_values(entry) -> str:
    """A rank's entry as short text: ``[0, 1, 2]``, ``[[0, 1], [2, 3]]`` or ``-``."""
    rows = _as_rows(entry)
    if rows is None:
        return "-"
    texts = ["[" + ", ".join(_format_number(v) for v in row.tolist()) + "]" for row in rows]
    if torch.as_tensor(entry).dim() <= 1:
        return texts[0]
    return "[" + ", ".join(texts) + "]"


def _print_table(title: str, columns: dict[str, list]) -> None:
    world_size = len(next(iter(columns.values())))
    cells = {name: [format_values(e) for e in entries] for name, entries in columns.items()}
    widths = {name: max(len(name), *(len(t) for t in texts)) for name, texts in cells.items()}
    print(title)
    print(("        " + "   ".join(name.ljust(widths[name]) for name in columns)).rstrip())
    for rank in range(world_size):
        print((f"rank {rank}  " + "   ".join(cells[name][rank].ljust(widths[name]) for name in columns)).rstrip())


def show_ranks(title: str, *, show_text: bool = True, cmap: str = "viridis", **columns) -> None:
    """Draw (and print) what every rank holds in each column, e.g. ``before=`` and ``after=``.

    ``columns``: name -> list with one entry per rank (tensor or None). Columns are drawn
    left to right in the order given, ranks top to bottom.
    """
    import matplotlib.pyplot as plt
    from matplotlib import colors

    if not columns:
        raise ValueError("give at least one column, e.g. show_ranks('title', before=[...], after=[...])")
    sizes = {len(entries) for entries in columns.values()}
    if len(sizes) != 1:
        raise ValueError(f"every column needs one entry per rank; got lengths {sorted(sizes)}")
    world_size = sizes.pop()
    rows = {name: [_as_rows(e) for e in entries] for name, entries in columns.items()}

    if show_text:
        _print_table(title, columns)

    present = [t for entries in rows.values() for t in entries if t is not None]
    low = min(float(t.min()) for t in present) if present else 0.0
    high = max(float(t.max()) for t in present) if present else 1.0
    norm = colors.Normalize(vmin=low, vmax=high if high > low else low + 1)
    colour_map = plt.get_cmap(cmap)

    # Same cell size everywhere: every panel in a column spans that column's widest entry,
    # every panel in a row spans that rank's tallest entry.
    col_width = {name: max([t.shape[1] for t in entries if t is not None] or [1]) for name, entries in rows.items()}
    row_height = [max([rows[n][r].shape[0] for n in rows if rows[n][r] is not None] or [1]) for r in range(world_size)]
    fig, axes = plt.subplots(
        world_size, len(rows), squeeze=False, dpi=80,
        figsize=(0.45 * sum(col_width.values()) + 1.2 * len(rows), 0.45 * sum(row_height) + 0.5 * world_size + 0.4),
        gridspec_kw={"width_ratios": [col_width[n] for n in rows], "height_ratios": row_height},
    )
    for col, (name, entries) in enumerate(rows.items()):
        for rank, tensor in enumerate(entries):
            ax = axes[rank][col]
            ax.set_xlim(-0.5, col_width[name] - 0.5)
            ax.set_ylim(row_height[rank] - 0.5, -0.5)
            ax.set_xticks([])
            ax.set_yticks([])
            if rank == 0:
                ax.set_title(name, fontsize=10)
            if col == 0:
                ax.set_ylabel(f"rank {rank}", rotation=0, ha="right", va="center", fontsize=9)
            if tensor is None:
                ax.text((col_width[name] - 1) / 2, (row_height[rank] - 1) / 2, "-", ha="center", va="center",
                        color="grey")
                for side in ax.spines.values():
                    side.set_visible(False)
                continue
            ax.imshow(tensor.numpy(), cmap=colour_map, norm=norm, aspect="auto",
                      extent=(-0.5, tensor.shape[1] - 0.5, tensor.shape[0] - 0.5, -0.5))
            for j in range(1, tensor.shape[1]):  # thin white borders keep neighbouring cells apart
                ax.axvline(j - 0.5, color="white", linewidth=1)
            for i in range(1, tensor.shape[0]):
                ax.axhline(i - 0.5, color="white", linewidth=1)
            for (i, j), value in zip(((i, j) for i in range(tensor.shape[0]) for j in range(tensor.shape[1])),
                                     tensor.flatten().tolist()):
                shade = colour_map(norm(value))
                light = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] > 0.5
                ax.text(j, i, _format_number(value), ha="center", va="center", fontsize=8,
                        color="black" if light else "white")
            for side in ax.spines.values():
                side.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    plt.show()
