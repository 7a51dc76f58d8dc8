"""How long from "launch" to results, for a 4-rank all_reduce, three ways, side by side.

    .venv/bin/python scripts/bench_launch.py [--world-size 4] [--repeats 5] [--first-launch]

1. course_lib.launch (what every chapter uses): the first launch in a fresh Jupyter
   kernel (right after `import course_lib`, server start included) and the median of
   later launches
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
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from course_lib import launch
from course_lib.launcher import available_cpus

HANG_LIMIT_S = 30


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


FIRST_LAUNCH_CELLS = [
    "import torch, torch.distributed as dist\nfrom course_lib import launch",
    "import time\n"
    "time.sleep({pause})  # a learner reading the first cells while the launch server starts\n"
    "def all_reduce_once():\n"
    "    tensor = torch.tensor([float(dist.get_rank())])\n"
    "    dist.all_reduce(tensor)\n"
    "    return tensor.item()\n"
    "started = time.perf_counter()\n"
    "launch(all_reduce_once, {world_size}, show_output=False, timeout=120)\n"
    "print(time.perf_counter() - started)",
]


def time_first_launch_in_a_kernel(world_size: int, pause: float = 0.0) -> float:
    """A learner's first launch: a fresh kernel imports the course, the next cell launches after
    ``pause`` seconds (0: at once, while the launch server is still importing torch)."""
    import nbformat
    from nbclient import NotebookClient

    cells = [nbformat.v4.new_code_cell(source.format(world_size=world_size, pause=pause))
             for source in FIRST_LAUNCH_CELLS]
    notebook = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(notebook, timeout=180, kernel_name="python3").execute()
    # the launch's own status line is a display output; the timing is the cell's printed line
    printed = "".join(output["text"] for output in notebook.cells[1].outputs
                      if output["output_type"] == "stream" and output["name"] == "stdout")
    return float(printed.split()[-1])


def time_mp_spawn(world_size: int) -> float:
    started = time.perf_counter()
    torch_mp.start_processes(spawn_worker, args=(world_size, free_port()), nprocs=world_size,
                             start_method="spawn", join=True)
    return time.perf_counter() - started


def _accelerate_in_child(world_size: int, conn) -> None:
    from accelerate import notebook_launcher

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # it prints a banner every launch
        notebook_launcher(accelerate_worker, num_processes=world_size, use_port=str(free_port()))
    conn.send(time.perf_counter() - started)


def time_accelerate(world_size: int) -> float | None:
    """Seconds for one notebook_launcher call, timed inside a child process; None if it hung.

    Some of its launches hung on this course's test machine (its elastic agent hosts the
    rendezvous store in the launching process and forks the workers beside the store's
    thread, the pattern that also deadlocked an early version of course_lib.launch).
    Running it in a child lets the benchmark stop such a launch, and its workers, and go on.
    """
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_accelerate_in_child, args=(world_size, send))
    child.start()
    send.close()
    if receive.poll(HANG_LIMIT_S):
        elapsed = receive.recv()
        child.join()
        return elapsed
    family = psutil.Process(child.pid)
    for process in family.children(recursive=True) + [family]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    child.join()
    return None


def time_import_torch() -> float:
    """A fresh interpreter's ``import torch`` (CUDA libraries included where the build has them)."""
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def first_launch_breakdown(world_size: int) -> None:
    """Where a learner's first launch spends its time: torch's import (which the launch server
    does once per kernel), and the first launch with and without the server already started."""
    for label, measure in [("import torch, fresh interpreter", time_import_torch),
                           ("first launch, right after import", lambda: time_first_launch_in_a_kernel(world_size)),
                           ("first launch, 8 s after import", lambda: time_first_launch_in_a_kernel(world_size, 8))]:
        values = [measure() for _ in range(3)]
        print(f"{label:34} {statistics.median(values):7.3f} s   (median of 3: "
              f"{', '.join(f'{t:.2f}' for t in values)})", flush=True)


def interleaved_medians(measures: dict, world_size: int, repeats: int) -> tuple[dict, dict]:
    """Median time of each way, and how many of its launches hung.

    The ways take turns, so background load hits all of them alike.
    """
    for measure in measures.values():
        measure(world_size)  # warm-up: page cache, lazy imports
    times = {name: [] for name in measures}
    hangs = {name: 0 for name in measures}
    for _ in range(repeats):
        for name, measure in measures.items():
            elapsed = measure(world_size)
            if elapsed is None:
                hangs[name] += 1
            else:
                times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items() if values}, hangs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--first-launch", action="store_true",
                        help="only where the first launch in a fresh kernel spends its time")
    options = parser.parse_args()
    n, repeats = options.world_size, options.repeats
    print(f"machine: {platform.machine()}, {available_cpus()} cores, torch {torch.__version__}, "
          f"Python {platform.python_version()}")

    if options.first_launch:
        first_launch_breakdown(n)
        return
    print(f"{n}-rank all_reduce, median of {repeats} (mp.spawn: {max(2, repeats // 2)}) after one warm-up each; "
          "launch and accelerate take turns")
    quick = {"launch": time_course_launch}
    try:
        import accelerate  # noqa: F401

        quick["accelerate"] = time_accelerate
    except ImportError:
        pass
    firsts = [time_first_launch_in_a_kernel(n) for _ in range(3)]
    medians, hangs = interleaved_medians(quick, n, repeats)
    spawn_medians, _ = interleaved_medians({"spawn": time_mp_spawn}, n, max(2, repeats // 2))
    ours, spawn = medians["launch"], spawn_medians["spawn"]
    print(f"course_lib.launch, first       {statistics.median(firsts):8.3f} s   in a fresh kernel right after "
          f"import (median of 3: {', '.join(f'{t:.2f}' for t in firsts)})")
    print(f"course_lib.launch              {ours:8.3f} s")
    print(f"torch.multiprocessing (spawn)  {spawn:8.3f} s   launch is {spawn / ours:5.1f}x faster")
    if "accelerate" not in quick:
        print("accelerate.notebook_launcher   not installed (pip install accelerate to compare)")
        return
    hung = f"   ({hangs['accelerate']} of {repeats} launches hung > {HANG_LIMIT_S} s and were stopped)"
    if "accelerate" not in medians:
        print(f"accelerate.notebook_launcher   every launch hung{hung}")
        return
    theirs = medians["accelerate"]
    print(f"accelerate.notebook_launcher   {theirs:8.3f} s   launch takes {ours / theirs:5.2f}x its time"
          + (hung if hangs["accelerate"] else ""))


if __name__ == "__main__":
    main()
