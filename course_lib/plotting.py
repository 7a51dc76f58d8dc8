"""Pictures of what each rank holds, and the diagrams of chapters 00-03.

``draw_launch_mechanics`` (chapter 00), ``draw_ring_steps`` (chapter 01) and
``draw_join_shadow`` (chapter 03) print their content as text too.

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

__all__ = ["format_values", "show_ranks", "draw_launch_mechanics", "draw_ring_steps", "draw_join_shadow"]


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


def _box(ax, x, y, w, h, text, colour, fontsize=8):
    from matplotlib.patches import FancyBboxPatch

    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=colour, ec="black", lw=0.8))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def _arrow(ax, start, end, text="", colour="black"):
    ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", color=colour, lw=1))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.15, text, ha="center", fontsize=7, color=colour)


def draw_launch_mechanics(world_size: int = 4) -> None:
    """Chapter 00: who starts whom in ``launch(fn, world_size)``, where they meet, what comes back."""
    import matplotlib.pyplot as plt

    steps = ["1. reserve a free port P", f"2. start {world_size} workers, env RANK, WORLD_SIZE, MASTER_ADDR:P ...",
             "3. rank 0 hosts the TCPStore on P; every rank registers, then gloo connects the ranks",
             "4. each rank runs fn (sent by value) with cores // world_size threads",
             "5. results and output return in rank order; any failure stops every rank"]
    print("\n".join(steps))
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=80)
    ax.set(xlim=(0, 10), ylim=(0, world_size + 1.2))
    ax.axis("off")
    _box(ax, 0.1, world_size / 2 - 0.2, 2.2, 1.4, "notebook kernel\nlaunch(fn, world_size)\nholds port P", "#dde8f7")
    for rank in range(world_size):
        y = world_size - rank - 0.3
        label = f"rank {rank}: RANK={rank}\nfn(*args) -> result"
        _box(ax, 4.3, y - 0.35, 2.4, 0.75, label, "#e4f2dc" if rank else "#f7e3c6")
        _arrow(ax, (2.35, world_size / 2 + 0.5), (4.25, y), "start + fn by value" if rank == 0 else "")
        _arrow(ax, (6.75, y), (7.6, world_size / 2 + 0.5) if rank else (7.6, world_size - 0.3))
    _box(ax, 7.65, world_size - 0.75, 2.2, 0.8, "TCPStore on P\n(hosted by rank 0)", "#f7e3c6")
    _box(ax, 7.65, world_size / 2 + 0.1, 2.2, 0.8, "gloo connections\nbetween the ranks", "#eeeeee")
    ax.text(3.3, 0.05, "results, output and errors flow back to the kernel, in rank order", ha="center", fontsize=7)
    ax.set_title("launch(fn, world_size): who starts whom, where the ranks meet", fontsize=9)
    plt.show()


def ring_all_reduce_states(values: list[list[float]]) -> tuple[list[list[list[float]]], int]:
    """Chapter 01: the ring all-reduce run step by step in one process, on plain numbers.

    ``values[r]`` is rank r's vector, cut into N chunks (one number per chunk here). Returns the
    state of every rank after each step (reduce-scatter, then all-gather) and the number of
    chunks sent per rank, so that the bytes in the cost model can be counted, not assumed.
    """
    n = len(values)
    state = [list(v) for v in values]
    states, sent = [[list(v) for v in state]], 0
    for step in range(n - 1):  # reduce-scatter: rank r sends chunk (r - step) to rank r + 1, which adds it
        outgoing = [(r, (r - step) % n, state[r][(r - step) % n]) for r in range(n)]
        for r, chunk, value in outgoing:
            state[(r + 1) % n][chunk] += value
        sent += 1
        states.append([list(v) for v in state])
    for step in range(n - 1):  # all-gather: rank r sends its finished chunk (r + 1 - step) onwards
        outgoing = [(r, (r + 1 - step) % n, state[r][(r + 1 - step) % n]) for r in range(n)]
        for r, chunk, value in outgoing:
            state[(r + 1) % n][chunk] = value
        sent += 1
        states.append([list(v) for v in state])
    return states, sent


def draw_ring_steps(states: list[list[list[float]]]) -> None:
    """Chapter 01: one panel per ring step; each rank's chunks as coloured cells."""
    import matplotlib.pyplot as plt

    n = len(states[0])
    fig, axes = plt.subplots(1, len(states), figsize=(1.25 * len(states), 1.6), dpi=80)
    for i, (ax, state) in enumerate(zip(axes, states)):
        ax.imshow(torch.tensor(state), cmap="viridis")
        for r in range(n):
            for c in range(n):
                ax.text(c, r, _format_number(state[r][c]), ha="center", va="center", fontsize=7, color="white")
        phase = "start" if i == 0 else ("reduce-scatter" if i < n else "all-gather")
        ax.set_title(f"{phase}\nstep {i}" if i else phase, fontsize=7)
        ax.set_xticks([])
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if i == 0 else [""] * n, fontsize=7)
    fig.suptitle("ring all-reduce: rows are ranks, columns are chunks", fontsize=8)
    plt.show()


def draw_join_shadow(batches_per_rank: list[int]) -> None:
    """Chapter 03: which all-reduces each rank runs under Join; a joined rank shadows with zeros."""
    import matplotlib.pyplot as plt

    steps = max(batches_per_rank)
    fig, ax = plt.subplots(figsize=(1.3 * steps + 1.5, 0.6 * len(batches_per_rank) + 0.6), dpi=80)
    for rank, batches in enumerate(batches_per_rank):
        for step in range(steps):
            own = step < batches
            colour, text = ("#9ecae1", f"all-reduce\nown gradient") if own else ("#dddddd", "shadow\nall-reduce of 0")
            _box(ax, step * 1.3, len(batches_per_rank) - rank - 1, 1.15, 0.8, text, colour, fontsize=7)
            print(f"rank {rank}, step {step}: {'own gradient' if own else 'joined: contributes zeros'}")
    ax.set(xlim=(-0.1, steps * 1.3), ylim=(-0.1, len(batches_per_rank)))
    ax.set_yticks([len(batches_per_rank) - r - 0.6 for r in range(len(batches_per_rank))],
                  [f"rank {r}" for r in range(len(batches_per_rank))])
    ax.set_xticks([s * 1.3 + 0.57 for s in range(steps)], [f"step {s}" for s in range(steps)])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title("Join: the rank that ran out of data keeps matching the others' all-reduces", fontsize=8)
    plt.show()
