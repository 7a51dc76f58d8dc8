"""Floating-point formats, pictured: bit layouts, ranges, loss-scale sweeps.

Defined in chapter 06 (mixed precision); the chapters on compression (05) and memory
(08) can reuse it::

    from course_lib.precision import LAYOUTS, bit_fields, draw_bit_layouts, draw_ranges
    bit_fields(1.0, torch.float16)        # ('0', '01111', '0000000000')
    draw_ranges({"gradients": magnitudes})

Every drawing prints the numbers it shows, because notebook tests compare text, not images.
"""

from __future__ import annotations

import math

import torch

__all__ = ["LAYOUTS", "DOCUMENTED_CUDA_FP32_OPS", "bit_fields", "draw_bit_layouts", "draw_ranges",
           "draw_scale_sweep", "show_scaled_gradients", "loss_scale_explorer", "plot_loss_curves", "tensor_bytes"]

# (sign, exponent, mantissa) bits of each format: IEEE 754 binary32 and binary16, and bfloat16,
# which keeps binary32's 8 exponent bits and cuts the mantissa to 7.
LAYOUTS = {
    torch.float32: (1, 8, 23),
    torch.float16: (1, 5, 10),
    torch.bfloat16: (1, 8, 7),
}

# Ops that CUDA autocast runs in float32, as listed by PyTorch's documentation (torch.amp,
# "CUDA Ops that can autocast to float32"); only the ops chapter 06 probes are listed. The CPU
# lists are compiled into torch (aten/src/ATen/autocast_mode.cpp), so chapter 06 measures them.
DOCUMENTED_CUDA_FP32_OPS = frozenset({
    "softmax", "log_softmax", "layer_norm", "group_norm", "exp", "sum", "pow", "norm", "cumsum",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits",
})

_INT_OF_SIZE = {4: torch.int32, 2: torch.int16}
_COLOURS = {"sign": "#f4a582", "exponent": "#92c5de", "mantissa": "#c2e699"}


def bit_fields(value: float, dtype: torch.dtype) -> tuple[str, str, str]:
    """The stored bits of ``value`` rounded to ``dtype``: (sign, exponent, mantissa) as '0'/'1' strings."""
    if dtype not in LAYOUTS:
        raise ValueError(f"bit_fields knows {sorted(map(str, LAYOUTS))}, not {dtype}")
    sign_bits, exponent_bits, mantissa_bits = LAYOUTS[dtype]
    stored = torch.tensor([value], dtype=dtype)
    size = stored.element_size()
    integer = int(stored.view(_INT_OF_SIZE[size]).item()) & ((1 << (8 * size)) - 1)
    text = format(integer, f"0{8 * size}b")
    return text[:sign_bits], text[sign_bits:sign_bits + exponent_bits], text[sign_bits + exponent_bits:]


def draw_bit_layouts(examples: list[tuple[float, torch.dtype]]) -> None:
    """One row of coloured bit cells per (value, dtype): sign, exponent, mantissa."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(examples) + 0.6), dpi=80)
    for row, (value, dtype) in enumerate(examples):
        fields = bit_fields(value, dtype)
        stored = torch.tensor([value], dtype=dtype).item()
        label = f"{str(dtype).replace('torch.', ''):8s} {value:.6g}"
        print(f"{label:24s} -> {' '.join(fields)}   (stored value {stored:.8g})")
        y, x = len(examples) - row - 1, 0
        for name, bits in zip(("sign", "exponent", "mantissa"), fields):
            for bit in bits:
                ax.add_patch(plt.Rectangle((x, y), 0.95, 0.8, fc=_COLOURS[name], ec="white"))
                ax.text(x + 0.47, y + 0.4, bit, ha="center", va="center", fontsize=7)
                x += 1
        ax.text(-0.5, y + 0.4, label, ha="right", va="center", fontsize=8, family="monospace")
    ax.set(xlim=(-12, 33), ylim=(-0.2, len(examples)))
    ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, fc=c) for c in _COLOURS.values()]
    ax.legend(handles, list(_COLOURS), loc="upper right", fontsize=7, ncol=3, bbox_to_anchor=(1, 1.25))
    plt.show()


def _log2(x: float) -> float:
    return math.log2(x)


def draw_ranges(magnitudes: dict[str, torch.Tensor], dtypes=(torch.float32, torch.bfloat16, torch.float16)) -> None:
    """Each format's subnormal and normal range on a log2 axis, with histograms of magnitudes over it.

    ``magnitudes``: name -> tensor of positive values (e.g. a model's non-zero gradient magnitudes).
    """
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4), dpi=80, sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1.3]})
    for name, values in magnitudes.items():
        logs = torch.log2(values.double().clamp_min(2.0 ** -160))
        top.hist(logs.numpy(), bins=80, alpha=0.6, label=name)
        print(f"{name}: {values.numel()} values, log2 magnitude from {logs.min().item():.1f} "
              f"to {logs.max().item():.1f}, median {logs.median().item():.1f}")
    top.set(ylabel="count", title="magnitudes against each format's range (log2 scale)")
    top.legend(fontsize=8)
    for row, dtype in enumerate(dtypes):
        info = torch.finfo(dtype)
        subnormal, normal, largest = _log2(info.smallest_normal) - (LAYOUTS[dtype][2]), _log2(info.smallest_normal), _log2(info.max)
        bottom.barh(row, normal - subnormal, left=subnormal, color="#fdb863", height=0.6)
        bottom.barh(row, largest - normal, left=normal, color="#5e3c99", height=0.6)
        name = str(dtype).replace("torch.", "")
        print(f"{name:9s} subnormal 2^{subnormal:.0f} .. normal 2^{normal:.0f} .. max 2^{largest:.2f}")
        for edge in (subnormal, normal, largest):
            top.axvline(edge, color="grey", lw=0.5, ls=":")
    bottom.set_yticks(range(len(dtypes)), [str(d).replace("torch.", "") for d in dtypes])
    bottom.set(xlabel="log2 |value|  (orange: subnormal, purple: normal)", xlim=(-60, 20))
    top.set_xlim(-60, 20)
    fig.tight_layout()
    plt.show()


def draw_scale_sweep(exponents: list[int], underflow_share: list[float], overflow_share: list[float]) -> None:
    """Share of gradients lost to underflow (zero) and to overflow (inf/NaN) against log2 of the loss scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.8), dpi=80)
    ax.plot(exponents, [100 * s for s in underflow_share], "o-", label="became 0 (underflow)")
    ax.plot(exponents, [100 * s for s in overflow_share], "s-", label="became inf/NaN (overflow)")
    ax.set(xlabel="loss scale = 2^k, k", ylabel="% of gradient values", yscale="symlog",
           title="fp16 backward of a trained model: what the loss scale saves and what it breaks")
    ax.legend(fontsize=8)
    plt.show()


def show_scaled_gradients(scaled_gradients, k: int) -> None:
    """Chapter 06: histogram of log2 |gradient| from an fp16 backward at loss scale 2^k, with fp16's limits marked.

    ``scaled_gradients(scale)`` runs the backward of ``loss * scale`` and returns the gradients
    before unscaling. Prints the shares that are 0 and inf/NaN.
    """
    import matplotlib.pyplot as plt

    grads = scaled_gradients(2.0 ** k).detach().double().cpu()
    finite_nonzero = grads[torch.isfinite(grads) & (grads != 0)].abs()
    zeros, bad = (grads == 0).float().mean().item(), (~torch.isfinite(grads)).float().mean().item()
    print(f"loss scale 2^{k}: {100 * zeros:.3f}% of the gradient values are 0 (with those that are 0 in fp32 "
          f"too, e.g. of inactive ReLU units), {100 * bad:.2f}% inf/NaN")
    fig, ax = plt.subplots(figsize=(7, 2.4), dpi=80)
    ax.hist(torch.log2(finite_nonzero).numpy(), bins=60, color="#5e3c99")
    info = torch.finfo(torch.float16)
    for edge, label in ((math.log2(info.smallest_normal) - LAYOUTS[torch.float16][2], "smallest subnormal"),
                        (math.log2(info.smallest_normal), "smallest normal"), (math.log2(info.max), "max")):
        ax.axvline(edge, color="#e66101", ls="--", lw=1)
        ax.text(edge, ax.get_ylim()[1] * 0.9, " " + label, fontsize=7, color="#e66101")
    ax.set(xlim=(-40, 20), xlabel="log2 |scaled gradient|", ylabel="count",
           title=f"fp16 backward at loss scale 2^{k}: {100 * zeros:.2f}% zeros, {100 * bad:.2f}% inf/NaN")
    plt.show()


def loss_scale_explorer(scaled_gradients, exponents=range(0, 33, 2)):
    """A slider over k; each change runs the fp16 backward at loss scale 2^k and redraws."""
    import ipywidgets as widgets

    exponents = list(exponents)
    return widgets.interact(lambda k: show_scaled_gradients(scaled_gradients, k),
                            k=widgets.SelectionSlider(options=exponents, value=exponents[len(exponents) // 2],
                                                      continuous_update=False, description="log2 S"))


def plot_loss_curves(curves: dict[str, list[float]], ylabel: str = "mean training loss") -> None:
    """One line per run, e.g. {'fp32': [...], 'bf16': [...]}."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.8), dpi=80)
    for name, values in curves.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", ms=3, label=name)
    ax.set(xlabel="epoch", ylabel=ylabel, yscale="log")
    ax.legend(fontsize=8)
    plt.show()


def tensor_bytes(tensors) -> int:
    """Bytes held by the given tensors (their elements, not Python overhead)."""
    return sum(t.numel() * t.element_size() for t in tensors)
