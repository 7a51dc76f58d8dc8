"""Learning-rate schedules and training curves, drawn (and printed) for the notebook.

Defined in chapter 07 (gradient accumulation and large batches), for any chapter that
trains with a schedule::

    from course_lib.schedules import lr_trajectory, plot_lr_schedules, plot_curves
    lrs = lr_trajectory(make_scheduler, steps=100)     # the LR the optimizer used at each step
    plot_lr_schedules({"warmup + cosine": lrs}, marks={"end of warmup": 10})
    plot_curves({"B=16": losses_16, "B=128": losses_128}, xlabel="epoch", ylabel="loss")

``one_thread()`` pins torch to one intra-op thread for a block of code: a run whose result
is compared with stored outputs then sums in the same order on a 2-core laptop and on a
64-core server.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["lr_trajectory", "plot_lr_schedules", "plot_curves", "one_thread"]


def lr_trajectory(make_scheduler, steps: int, base_lr: float = 1.0) -> list[float]:
    """The learning rate in force at each of ``steps`` optimizer steps.

    ``make_scheduler(optimizer)`` builds a ``torch.optim.lr_scheduler`` object for a
    throw-away SGD optimizer with learning rate ``base_lr``; the scheduler is stepped after
    every optimizer step, as in a training loop.
    """
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    scheduler = make_scheduler(optimizer)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def plot_lr_schedules(schedules: dict[str, list[float]], marks: dict[str, int] | None = None,
                      title: str = "learning rate per step") -> None:
    """One line per schedule; ``marks`` draws labelled vertical lines (e.g. the end of warmup)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.6), dpi=80)
    for name, lrs in schedules.items():
        ax.plot(range(len(lrs)), lrs, label=name)
    for label, step in (marks or {}).items():
        ax.axvline(step, color="grey", linestyle=":", linewidth=1)
        ax.text(step, ax.get_ylim()[1], f" {label}", va="top", fontsize=8, color="grey")
    ax.set(xlabel="optimizer step", ylabel="learning rate", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def plot_curves(curves: dict[str, list[float]], xlabel: str, ylabel: str, title: str = "",
                log_y: bool = False, x_scale: dict[str, float] | None = None) -> None:
    """Training curves side by side; ``x_scale[name]`` stretches a curve's x axis (steps -> epochs)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 2.8), dpi=80)
    for name, values in curves.items():
        scale = (x_scale or {}).get(name, 1.0)
        ax.plot([i * scale for i in range(len(values))], values, label=name, linewidth=1)
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


@contextlib.contextmanager
def one_thread():
    """Run the block with one intra-op thread, then restore the previous setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
