"""Pictures for the ring all-reduce: per-step chunk states, bandwidth curves, an α–β explorer.

Defined in chapter 05 (ring all-reduce). Every function draws with matplotlib and also
prints what it draws, because a notebook test compares text, not images.

* ``draw_ring_states(states, n_ranks)`` — one panel per step; rows are ranks, columns are
  chunks, each cell says which ranks' contributions that chunk holds. ``states`` is a list
  of ``(label, masks)`` where ``masks[rank][chunk]`` is a bit mask (bit r set: rank r's
  contribution is in it). ``ring_state_slider`` shows the same states one at a time.
* ``plot_bandwidth(sizes, seconds_by_name, ...)`` — time and bus bandwidth against size.
* ``cost_model_explorer(naive, ring)`` — sliders over size, ranks, latency and bandwidth for
  two cost functions ``f(n, size_bytes, alpha, beta) -> seconds``; ``draw_cost_model`` is its
  static rendering.
"""

from __future__ import annotations

__all__ = ["contributors", "draw_ring_states", "ring_state_slider", "plot_bandwidth",
           "draw_cost_model", "cost_model_explorer"]


def contributors(mask: int) -> list[int]:
    """The ranks whose bits are set in mask: 0b1011 -> [0, 1, 3]."""
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def _label(mask: int, n_ranks: int) -> str:
    ranks = contributors(mask)
    return "all" if len(ranks) == n_ranks else "+".join(map(str, ranks))


def _draw_state(ax, masks, n_ranks, title, show_ranks=True):
    import numpy as np

    counts = np.array([[len(contributors(m)) for m in row] for row in masks])
    ax.imshow(counts, cmap="YlGnBu", vmin=0, vmax=n_ranks)
    for r, row in enumerate(masks):
        for c, mask in enumerate(row):
            text = _label(mask, n_ranks)
            ax.text(c, r, text, ha="center", va="center", fontsize=7 if len(text) < 5 else 5.5,
                    color="white" if counts[r, c] > n_ranks / 2 else "black")
    ax.set_xticks(range(len(masks[0])), [f"c{c}" for c in range(len(masks[0]))], fontsize=7)
    ax.set_yticks(range(len(masks)), [f"rank {r}" if show_ranks else "" for r in range(len(masks))], fontsize=7)
    ax.set_title(title, fontsize=7)


def draw_ring_states(states, n_ranks: int) -> None:
    """Every step side by side, and each state printed as text."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(states), figsize=(1.9 * len(states), 2.1), dpi=80)
    for i, (ax, (label, masks)) in enumerate(zip(axes, states)):
        _draw_state(ax, masks, n_ranks, label, show_ranks=(i == 0))
        print(f"{label:>18}: " + " | ".join(
            "rank %d [%s]" % (r, ", ".join(_label(m, n_ranks) for m in row)) for r, row in enumerate(masks)))
    fig.suptitle("what each rank's chunks hold (numbers: whose contributions are summed in)", fontsize=8)
    fig.tight_layout()
    plt.show()


def ring_state_slider(states, n_ranks: int):
    """An ipywidgets slider over the steps (needs a live kernel; the static picture is above)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    def show(step):
        label, masks = states[step]
        fig, ax = plt.subplots(figsize=(3, 2.4), dpi=80)
        _draw_state(ax, masks, n_ranks, f"step {step}: {label}")
        plt.show()

    return widgets.interactive(show, step=widgets.IntSlider(0, 0, len(states) - 1, description="step"))


def plot_bandwidth(sizes, seconds_by_name, busbw_by_name, fitted=None, memcpy=None) -> None:
    """Left: seconds per call against size (log-log), with a fitted model; right: busbw."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), dpi=80)
    for name, seconds in seconds_by_name.items():
        left.plot(sizes, seconds, "o", label=f"{name} (measured)")
        right.plot(sizes, [b / 1e9 for b in busbw_by_name[name]], "o-", label=name)
    if fitted is not None:
        label, model = fitted
        left.plot(sizes, [model(s) for s in sizes], "-", color="gray", label=label)
    if memcpy is not None:
        right.axhline(memcpy / 1e9, color="gray", ls="--", label="memcpy (this machine)")
    left.set(xscale="log", yscale="log", xlabel="bytes", ylabel="seconds per call")
    right.set(xscale="log", yscale="log", xlabel="bytes", ylabel="bus bandwidth (GB/s)")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    plt.show()


def draw_cost_model(naive, ring, size_bytes, alpha, beta, ranks=(2, 4, 8, 16, 32, 64)) -> None:
    """Static rendering: both models' time against N for one size, latency and bandwidth."""
    import matplotlib.pyplot as plt

    naive_ms = [1e3 * naive(n, size_bytes, alpha, beta) for n in ranks]
    ring_ms = [1e3 * ring(n, size_bytes, alpha, beta) for n in ranks]
    print(f"S = {size_bytes / 1e6:g} MB, α = {alpha * 1e6:g} µs, bandwidth = {1e-9 / beta:g} GB/s")
    for n, a, b in zip(ranks, naive_ms, ring_ms):
        print(f"  N = {n:>3}: naive {a:10.3f} ms   ring {b:10.3f} ms   ring/naive {b / a:.3f}")
    fig, ax = plt.subplots(figsize=(4.5, 2.8), dpi=80)
    ax.plot(ranks, naive_ms, "o-", label="naive (through one rank)")
    ax.plot(ranks, ring_ms, "o-", label="ring")
    ax.set(xscale="log", yscale="log", xlabel="ranks N", ylabel="ms",
           title=f"all-reduce of {size_bytes / 1e6:g} MB, α–β model")
    ax.set_xticks(list(ranks), [str(n) for n in ranks])
    ax.minorticks_off()  # log-axis minor labels would overprint the rank counts
    ax.legend(fontsize=7)
    fig.tight_layout()
    plt.show()


def cost_model_explorer(naive, ring):
    """Sliders: size (log10 bytes), ranks, latency (µs) and bandwidth (GB/s)."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    def show(log10_bytes, n, alpha_us, gb_per_s):
        size, alpha, beta = 10.0 ** log10_bytes, alpha_us * 1e-6, 1 / (gb_per_s * 1e9)
        names = ["naive", "ring"]
        # Both models are linear in alpha and beta, so each time splits exactly into its two terms.
        latency = [1e3 * model(n, size, alpha, 0.0) for model in (naive, ring)]
        transfer = [1e3 * model(n, size, 0.0, beta) for model in (naive, ring)]
        fig, ax = plt.subplots(figsize=(4.5, 2.6), dpi=80)
        ax.barh(names, latency, color="#c44e52", label="latency terms (α)")
        ax.barh(names, transfer, left=latency, color="#4c72b0", label="bandwidth terms (β)")
        for y, (lat, tra) in enumerate(zip(latency, transfer)):
            ax.text(lat + tra, y, f" {lat + tra:.3g} ms", va="center", fontsize=8)
        ax.set(xlabel="ms", title=f"S = {size:.3g} B, N = {n}")
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        plt.show()
        for name, lat, tra in zip(names, latency, transfer):
            print(f"{name:>5}: {lat + tra:.4g} ms = latency {lat:.4g} ms + bandwidth {tra:.4g} ms")

    return widgets.interactive(
        show,
        log10_bytes=widgets.FloatSlider(value=8, min=3, max=10, step=0.25, description="log10 bytes"),
        n=widgets.IntSlider(value=8, min=2, max=128, description="ranks"),
        alpha_us=widgets.FloatSlider(value=10, min=0.5, max=200, step=0.5, description="α (µs)"),
        gb_per_s=widgets.FloatSlider(value=12.5, min=0.5, max=400, step=0.5, description="GB/s"))
