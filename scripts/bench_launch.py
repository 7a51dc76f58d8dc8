"""How long from "launch" to results, for a 4-rank all_reduce, three ways, side by side.

    python scripts/bench_launch.py [--world-size 4] [--repeats 5]

1. course_lib.launch (fork where safe; what every chapter uses)
2. torch.multiprocessing.spawn with the spawn start method (what the PyTorch
   tutorials use; each worker starts a fresh interpreter and imports torch)
3. accelerate.notebook_launcher, if accelerate is installed (fork, like ours)

Each way runs the same work: initialise the process group, all_reduce one tensor,
tear down. The script prints the median time of each and the ratios, measured in
this one run on this machine (a benchmark, not a test: timings depend on the machine).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from course_lib import launch
from course_lib.launcher import available_cpus


def all_reduce_once() -> float:
    tensor = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(tensor)
    return tensor.item()


def spawn_worker(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    all_reduce_once()
    dist.destroy_process_group()


def accelerate_worker() -> None:
    dist.init_process_group("gloo")
    all_reduce_once()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def time_course_launch(world_size: int) -> float:
    started = time.perf_counter()
    results = launch(all_reduce_once, world_size, show_output=False, timeout=120)
    elapsed = time.perf_counter() - started
    assert results == [float(sum(range(world_size)))] * world_size
    return elapsed


def time_mp_spawn(world_size: int) -> float:
    started = time.perf_counter()
    torch_mp.start_processes(spawn_worker, args=(world_size, free_port()), nprocs=world_size,
                             start_method="spawn", join=True)
    return time.perf_counter() - started


def time_accelerate(world_size: int) -> float:
    from accelerate import notebook_launcher

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a banner every launch
        notebook_launcher(accelerate_worker, num_processes=world_size, use_port=str(free_port()))
    return time.perf_counter() - started


def interleaved_medians(measures: dict, world_size: int, repeats: int) -> dict:
    """Median time of each way; the ways take turns, so background load hits all alike."""
    for measure in measures.values():
        measure(world_size)  # warm-up: page cache, lazy imports
    times = {name: [] for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            times[name].append(measure(world_size))
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    n, repeats = options.world_size, options.repeats
    print(f"{n}-rank all_reduce, median of {repeats} (mp.spawn: {max(2, repeats // 2)}) after one warm-up each; "
          "launch and accelerate take turns")
    print(f"machine: {platform.machine()}, {available_cpus()} cores, torch {torch.__version__}, "
          f"Python {platform.python_version()}")

    measures = {"launch": time_course_launch, "spawn": time_mp_spawn}
    try:
        import accelerate  # noqa: F401

        measures["accelerate"] = time_accelerate
    except ImportError:
        pass
    quick = {name: m for name, m in measures.items() if name != "spawn"}
    medians = interleaved_medians(quick, n, repeats)
    medians["spawn"] = interleaved_medians({"spawn": time_mp_spawn}, n, max(2, repeats // 2))["spawn"]
    ours, spawn = medians["launch"], medians["spawn"]
    print(f"course_lib.launch              {ours:8.3f} s")
    print(f"torch.multiprocessing (spawn)  {spawn:8.3f} s   launch is {spawn / ours:5.1f}x faster")
    if "accelerate" not in medians:
        print("accelerate.notebook_launcher   not installed (pip install accelerate to compare)")
        return
    theirs = medians["accelerate"]
    print(f"accelerate.notebook_launcher   {theirs:8.3f} s   launch takes {ours / theirs:5.2f}x its time")


if __name__ == "__main__":
    main()
