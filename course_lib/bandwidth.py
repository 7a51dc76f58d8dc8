"""Measure communication the way the field reports it: algorithm and bus bandwidth, α–β fits.

Defined in chapter 05 (ring all-reduce), reused by the chapters that time communication.
Inside a worker::

    from course_lib.bandwidth import sweep, SIZES_1K_TO_64M
    seconds = sweep({"gloo": dist.all_reduce, "mine": my_all_reduce}, SIZES_1K_TO_64M)

returns, for each name, the time of one call per size: after a warm-up call, a few calls are
timed one by one, each call as long as its slowest rank took, and the fastest call is kept (other
work on the machine can only make a call slower, never faster). In the notebook::

    busbw = bus_bandwidth(size_bytes, seconds, "all_reduce", world_size)
    alpha, beta = fit_alpha_beta(sizes, seconds)   # t ≈ alpha + beta * size

Bus bandwidth follows NVIDIA nccl-tests (doc/PERFORMANCE.md): algbw = S / t, and
busbw = algbw × a factor that makes different collectives and rank counts comparable with
the hardware's link speed: all-reduce 2(n−1)/n, reduce-scatter and all-gather (n−1)/n,
broadcast and reduce 1 (S is the whole array in every case).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

__all__ = ["BUSBW_FACTOR", "SIZES_1K_TO_64M", "bus_bandwidth", "calls_for", "fit_alpha_beta",
           "memcpy_bandwidth", "sweep", "time_calls"]

SIZES_1K_TO_64M = [1024 * 4**k for k in range(9)]  # 1 KiB, 4 KiB, ..., 64 MiB

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}


def bus_bandwidth(size_bytes: float, seconds: float, collective: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth in bytes per second."""
    return size_bytes / seconds * BUSBW_FACTOR[collective](world_size)


def calls_for(size_bytes: int, budget_bytes: int = 16 * 2**20, most: int = 40) -> int:
    """More calls for small sizes (their times are short and noisy), at least 3."""
    return max(3, min(most, budget_bytes // max(size_bytes, 1)))


def time_calls(fn, tensor: torch.Tensor, calls: int) -> float:
    """Seconds of the fastest of ``calls`` calls of fn(tensor), each the slowest rank's, after a warm-up call.

    The fastest, not the mean: a rank that loses its CPU to other work for a moment (10-100 ms is
    common on a busy machine) makes one call slower, never one faster.
    """
    fn(tensor)
    dist.barrier()
    seconds = torch.empty(calls, dtype=torch.float64)
    for call in range(calls):
        start = time.perf_counter()
        fn(tensor)
        seconds[call] = time.perf_counter() - start
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a collective is as slow as its slowest rank
    return seconds.min().item()


def sweep(fns: dict, sizes_bytes: list, dtype=torch.float32) -> dict:
    """{name: [seconds per call at each size]}; the names are timed one after the other per size."""
    times = {name: [] for name in fns}
    element = torch.tensor([], dtype=dtype).element_size()
    for size in sizes_bytes:
        tensor = torch.ones(size // element, dtype=dtype)
        for name, fn in fns.items():
            times[name].append(time_calls(fn, tensor, calls_for(size)))
    return times


def fit_alpha_beta(sizes_bytes, seconds) -> tuple[float, float]:
    """Least-squares fit of t = alpha + beta * S, each point weighted by 1/t.

    Plain least squares would fit only the large sizes (their times are 10,000 times
    larger); dividing each equation by its measured time fits the relative error, so the
    latency-bound small sizes decide alpha and the bandwidth-bound large ones beta.
    """
    s = torch.tensor(sizes_bytes, dtype=torch.float64)
    t = torch.tensor(seconds, dtype=torch.float64)
    design = torch.stack([torch.ones_like(s), s], dim=1) / t[:, None]
    solution = torch.linalg.lstsq(design, torch.ones_like(t)[:, None]).solution
    alpha, beta = solution[:, 0].tolist()
    return alpha, beta


def memcpy_bandwidth(size_bytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes per second of one large tensor copy on this machine (the best of a few)."""
    source = torch.ones(size_bytes // 4)
    target = torch.empty_like(source)
    target.copy_(source)  # touch the pages first
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - start)
    return size_bytes / best
