"""What a timing ran on, and small timing helpers (introduced in chapter 02; used from 00 on).

Every measured number in the course is printed next to ``hardware_line()``: the CPU model,
the cores this process may use, the load average (other programs on a shared machine slow a
measurement down), the GPUs and the torch version. ``best_of`` and ``median_of`` are the two
ways the course summarises repeated timings.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from .launcher import available_cpus


def cpu_name() -> str:
    """The CPU model as the operating system names it (Linux: /proc/cpuinfo)."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> float | None:
    """The 1-minute load average: how many cores other programs kept busy (None on Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def free_cores(seconds: float = 0.5) -> float | None:
    """Cores of this process's share that no program used over the next ``seconds`` (this one's other
    threads included), from the operating system's CPU counters: what a measurement that needs idle
    cores can count on right now. The load average cannot tell: it trails the last minute. None where
    the counters cannot be read."""
    import psutil

    try:
        busy = psutil.cpu_percent(interval=seconds) / 100 * (psutil.cpu_count() or 1)
    except (OSError, RuntimeError, psutil.Error):
        return None
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return round(max(0.0, min(mine, (psutil.cpu_count() or 1) - busy)), 1)


def gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def hardware_line() -> str:
    """One line to print next to every timing."""
    load = load_average()
    gpus = gpu_names()
    gpu_text = f"{len(gpus)} GPU(s) ({gpus[0]})" if gpus else "no GPU"
    load_text = f"load average {load:.1f}" if load is not None else "load unknown"
    return (f"{cpu_name()}, {available_cpus()} CPU cores usable, {load_text}, {gpu_text}, "
            f"torch {torch.__version__}")


def seconds(work: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of ``work``."""
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def best_of(work: Callable[[], object], repeats: int = 5) -> float:
    """The fastest of ``repeats`` calls: other programs can only make a try slower."""
    return min(seconds(work) for _ in range(repeats))


def median_of(work: Callable[[], object], repeats: int = 20, warmup: int = 3) -> float:
    """The median of ``repeats`` calls after ``warmup`` untimed ones: robust to a disturbed call."""
    for _ in range(warmup):
        work()
    return statistics.median(seconds(work) for _ in range(repeats))


def print_ms_table(title: str, rows: dict[str, dict[int, float]], columns) -> None:
    """Print seconds as milliseconds, one row per way of doing it, one column per worker count."""
    print(f"{title:36s}" + "".join(f"{f'n={n}':>9s}" for n in columns))
    for name, row in rows.items():
        print(f"{name:36s}" + "".join(f"{row[n] * 1e3:9.2f}" if n in row else f"{'':9s}" for n in columns))


def print_speedups(rows: dict[str, dict[int, float]], baseline: float, names) -> None:
    """For each named row: baseline time / time, per worker count (2.00x = twice as fast)."""
    for name in names:
        print(f"{name}: speed-up over the plain step " +
              ", ".join(f"n={n}: {baseline / t:.2f}x" for n, t in rows[name].items()))
