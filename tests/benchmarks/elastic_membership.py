"""Elastic membership with ``torchrun --nnodes=1:2``: how long a job takes to shrink and to grow.

Two agents ("nodes", one worker each) on this machine form a job of world size 2. Then one node
is lost (its agent and its worker are SIGKILLed): the other agent notices, re-runs the rendezvous
and restarts its worker at world size 1. Then a new node joins and the job grows back to 2. The
workers log (time, WORLD_SIZE) at every step; the transition times are measured from the kill /
the new agent's start to the first step at the new world size. Finally it shows what does *not*
shrink the job: killing only an agent leaves its worker running.

Each trial runs every rendezvous setting in turn (so background load hits them alike) and the
summary prints each setting's times next to the default's:

    python tests/benchmarks/elastic_membership.py [--trials 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from course_lib.torchrun import Nodes, accepts_connections, free_port  # noqa: E402
from course_lib.torchrun_script import write_torchrun_script  # noqa: E402

SETTINGS = {  # --rdzv-conf values; chapter 04 uses the last one with last_call_timeout=3 (its text says why)
    "default": "",
    "last_call_timeout=1": "last_call_timeout=1",
    "last_call 1, keep-alive 1 s x 5": "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=5",
}


def log_steps(folder):
    import time as _time
    ones = torch.ones(1)
    events = os.path.join(folder, "events.txt")
    while not os.path.exists(os.path.join(folder, "stop")):
        dist.all_reduce(ones)
        if dist.get_rank() == 0:
            with open(events, "a") as out:
                out.write(f"{_time.time()} {dist.get_world_size()}\n")
        _time.sleep(0.1)
    return 0


def first_step_at(folder, world, after):
    path = folder / "events.txt"
    for line in path.read_text().splitlines() if path.exists() else ():
        stamp, size = line.split()
        if float(stamp) > after and int(size) == world:
            return float(stamp)
    return None


def one_trial(conf: str) -> dict[str, float | bool]:
    folder = Path(tempfile.mkdtemp(prefix="membership-"))
    script = write_torchrun_script(log_steps, folder / "log_steps.py", args=(str(folder),))
    port = free_port()
    options = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               "--rdzv-id=membership", "--max-restarts=5", *([f"--rdzv-conf={conf}"] if conf else [])]
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    with Nodes(script, options, timeout=400, env=env) as nodes:
        nodes.start("a")
        # a hosts the rendezvous store (the one node the job cannot lose) before b starts
        nodes.wait_until(lambda: accepts_connections(port), "node a to host the rendezvous store")
        b = nodes.start("b")
        nodes.wait_until(lambda: first_step_at(folder, 2, 0) is not None, "a job of world size 2")
        node_b = [psutil.Process(b.process.pid), *psutil.Process(b.process.pid).children(recursive=True)]
        killed_at = time.time()
        for proc in node_b:
            proc.kill()
        nodes.wait_until(lambda: first_step_at(folder, 1, killed_at) is not None, "world size 1")
        joined_at = time.time()
        c = nodes.start("c")
        nodes.wait_until(lambda: first_step_at(folder, 2, joined_at) is not None, "world size 2 again")
        worker = psutil.Process(c.process.pid).children(recursive=True)[0]
        os.kill(c.process.pid, signal.SIGKILL)  # only the agent
        time.sleep(3)
        survived = worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE
        (folder / "stop").touch()
    return {"down": first_step_at(folder, 1, killed_at) - killed_at,
            "up": first_step_at(folder, 2, joined_at) - joined_at, "worker survived its agent": survived}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} cores")
    times = {name: [] for name in SETTINGS}
    for trial in range(args.trials):
        for name, conf in SETTINGS.items():
            result = one_trial(conf)
            times[name].append(result)
            print(f"trial {trial + 1} {name:>32}: shrink {result['down']:5.1f} s, grow {result['up']:5.1f} s, "
                  f"worker survived its agent's kill: {result['worker survived its agent']}", flush=True)
    base_down = statistics.median(r["down"] for r in times["default"])
    print("\nmedian over trials          shrink (s)  grow (s)  shrink vs default")
    for name, results in times.items():
        down = statistics.median(r["down"] for r in results)
        up = statistics.median(r["up"] for r in results)
        print(f"{name:>32} {down:9.1f} {up:9.1f} {down / base_down:10.2f}x")


if __name__ == "__main__":
    main()
