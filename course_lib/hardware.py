"""What a timing ran on, and small timing helpers (introduced in chapter 02; used from 00 on).

Every measured number in the course is printed between ``hardware_line()`` and ``after_line()``:
the CPU model, the cores this process may use, the load (other programs on a shared machine slow a
measurement down) before and after, the GPUs and the torch version. ``best_of`` and ``median_of`` are the two
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
from .launcher.devices import real_cpus


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


def cores_here() -> int:
    """The cores this process may really run on (its affinity), whatever ``COURSE_CPUS`` pretends. A timed
    launch sizes its ranks' threads by these: threads that outnumber the real cores wait for each other at
    every step of a matrix multiply, and on a busy machine a second of work takes minutes."""
    return real_cpus()


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
    return round(float(max(0.0, min(cores_here(), (psutil.cpu_count() or 1) - busy))), 1)


def gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def load_line(free: float | None = None, seconds: float = 0.5) -> str:
    """The machine's load right now: the 1-minute load average and the cores no program used over the next
    ``seconds`` (or ``free``, if just measured). The average trails the last minute; the free cores say
    what a measurement starting now can count on."""
    load = load_average()
    free = free_cores(seconds) if free is None else free
    load_text = f"load average {load:.1f}" if load is not None else "load unknown"
    free_text = f"{free:.1f} of {cores_here()} cores free" if free is not None else "free cores unknown"
    return f"{load_text}, {free_text}"


def hardware_line(free: float | None = None) -> str:
    """One line to print just before every timing: what it runs on, and how busy the machine is."""
    gpus = gpu_names()
    gpu_text = f"{len(gpus)} GPU(s) ({gpus[0]})" if gpus else "no GPU"
    return (f"{cpu_name()}, {available_cpus()} CPU cores usable, {load_line(free)}, {gpu_text}, "
            f"torch {torch.__version__}")


def after_line(free: float | None = None) -> str:
    """One line to print just after every timing: the load it ended at (a program that started meanwhile
    shows here, not in the line printed before)."""
    return f"after the measurement: {load_line(free)}"


class MachineLoad:
    """The machine's load just before and just after a measurement::

        with machine_load() as load:
            timings = launch(timed_steps, world_size=2)
        print(load)   # two lines: hardware_line() taken before, after_line() taken after

    A program that started or stopped meanwhile shows as a difference between the two. ``free_before``
    and ``free_after`` hold the free cores as numbers."""

    def __enter__(self) -> "MachineLoad":
        self.free_before = free_cores()
        self.before = hardware_line(self.free_before)
        self.free_after, self.after = None, None
        return self

    def __exit__(self, *exception) -> bool:
        self.free_after = free_cores()
        self.after = after_line(self.free_after)
        return False

    def __str__(self) -> str:
        return f"{self.before}\n{self.after or 'after the measurement: not reached'}"


def machine_load() -> MachineLoad:
    return MachineLoad()


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
