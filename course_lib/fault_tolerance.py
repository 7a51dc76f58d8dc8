"""Failures, checkpoints and silent errors, by the numbers.

Introduced in chapter 14 (fault tolerance). Small functions the lesson uses to predict and to count:
the mean time between failures of a cluster, the Young/Daly checkpoint interval, the share of time
lost to checkpoints and redone work, a clock that counts, in steps, what a run with failures costs,
the files a checkpoint wrote, and a checksum that no single flipped bit escapes.
"""

from __future__ import annotations

import math
import os
import random

import torch


def mtbf_hours(interruptions: int, days: float, devices: int) -> tuple[float, float]:
    """(the cluster's, one device's) mean time between failures, in hours, from a failure count.

    A cluster of ``devices`` that fails ``interruptions`` times in ``days`` fails every
    days * 24 / interruptions hours; if every device fails independently at the same rate, one
    device fails ``devices`` times less often.
    """
    cluster = days * 24 / interruptions
    return cluster, cluster * devices


def young_daly_interval(delta: float, mtbf: float) -> float:
    """The checkpoint interval T = sqrt(2 * delta * M) that minimises lost_fraction (same units)."""
    return math.sqrt(2 * delta * mtbf)


def lost_fraction(interval: float, delta: float, mtbf: float) -> float:
    """First-order share of time lost: delta / T writing checkpoints, T / (2M) redoing lost work."""
    return delta / interval + interval / (2 * mtbf)


def expected_goodput(interval: int, delta: int, mtbf: float) -> float:
    """Useful steps per step of clock when each clock step fails with probability 1 / mtbf.

    A segment of T steps and its checkpoint (delta more steps) needs L = T + delta failure-free clock
    steps in a row; with a failed clock step counted and the segment started again, that takes
    (q**-L - 1) / p clock steps on average (p = 1 / mtbf, q = 1 - p). Restarts cost nothing here.
    """
    p = 1 / mtbf
    return interval / (((1 - p) ** -(interval + delta) - 1) / p)


def failure_clock_steps(mtbf: float, horizon: int, seed: int) -> list[int]:
    """The clock steps (1, 2, ...) that fail, each with probability 1 / mtbf: seeded, the same everywhere."""
    rng = random.Random(seed)
    return [t for t in range(1, horizon + 1) if rng.random() < 1 / mtbf]


def run_with_failures(total_steps: int, interval: int, delta: int, failures: list[int]) -> dict:
    """Count what a run costs on a clock where a training step takes 1 and a checkpoint ``delta``.

    A failure in a clock step loses that step and everything since the last checkpoint (a failure
    while writing loses the checkpoint too); the run restarts at once from the last checkpoint.
    Checkpoints are written after every ``interval`` steps, except after the last step.
    Returns the clock at the end, the training steps executed, the failures hit and the restarts'
    starting steps.
    """
    failing, clock, executed, saved, step, restarts = set(failures), 0, 0, 0, 0, []
    while step < total_steps:
        clock += 1
        if clock in failing:
            step = saved
            restarts.append(saved)
            continue
        step += 1
        executed += 1
        if step % interval == 0 and step < total_steps:
            hit = [t for t in range(clock + 1, clock + delta + 1) if t in failing]
            if hit:
                clock = hit[0]
                step = saved
                restarts.append(saved)
                continue
            clock += delta
            saved = step
    return {"clock": clock, "executed": executed, "failures": len(restarts), "restarts": restarts}


def checkpoint_files(path) -> list[tuple[str, int]]:
    """(name, bytes) of every file under ``path``, sorted by name."""
    return sorted((os.path.relpath(os.path.join(root, name), path), os.path.getsize(os.path.join(root, name)))
                  for root, _, names in os.walk(path) for name in names)


def bits_checksum(tensors) -> int:
    """The sum of the float64 tensors' bit patterns read as 64-bit integers (wrapping).

    Flipping one bit adds or subtracts a power of two below 2**64, so the sum always changes;
    a floating-point sum of the values can round such a change away.
    """
    total = torch.zeros((), dtype=torch.int64)
    for tensor in tensors:
        if tensor.dtype != torch.float64:
            raise TypeError(f"bits_checksum reads float64 tensors, got {tensor.dtype}")
        total = total + tensor.detach().contiguous().view(torch.int64).sum()
    return int(total)


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flip one bit (0 = the lowest of the mantissa) of element ``index`` of a float64 tensor, in place."""
    with torch.no_grad():
        bits = tensor.view(-1).view(torch.int64)
        bits[index] = bits[index] ^ (1 << bit)


def plot_goodput(intervals, predicted, first_order, simulated, measured, *, delta, mtbf, ax=None):
    """Goodput against the checkpoint interval: the formulas as lines, the counted runs as points."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.2), dpi=80)
    ax.plot(intervals, predicted, label="expected (failure per step 1/M)")
    ax.plot(intervals, first_order, "--", label="first order: 1 - δ/T - T/(2M)")
    ax.plot(*zip(*simulated), "o", ms=4, label="clock model, mean of many seeds")
    ax.plot(*zip(*measured), "s", ms=8, mfc="none", mew=2, label="real run on 2 ranks (one seed)")
    ax.axvline(young_daly_interval(delta, mtbf), color="grey", lw=0.8)
    ax.set(xlabel="checkpoint interval T (steps)", ylabel="goodput (useful / clock steps)",
           title=f"δ = {delta} steps, M = {mtbf:g} steps; grey: √(2δM)")
    ax.set_ylim(0.0, 1.0)
    ax.legend(fontsize=8, loc="lower center")
    return ax
