"""Elastic membership with ``torchrun --nnodes=1:2``: how long a job takes to shrink and to grow.

Two agents ("nodes", one worker each) on this machine form a job of world size 2. Then one node
is lost (its agent and its worker are SIGKILLed): the other agent notices, re-runs the rendezvous
and restarts its worker at world size 1. Then a new node joins and the job grows back to 2. The
workers log (time, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT) at every step; the transition times are
measured from the kill / the new agent's start to the first step at the new world size. Finally it
shows what does *not* shrink the job: killing only an agent leaves its worker running.

    python tests/benchmarks/elastic_membership.py [--last-call 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from course_lib.torchrun import TORCHRUN, Agent, _stop, free_port  # noqa: E402
from course_lib.torchrun_script import write_torchrun_script  # noqa: E402


def log_steps(folder):
    import time as _time
    ones = torch.ones(1)
    events = os.path.join(folder, "events.txt")
    while not os.path.exists(os.path.join(folder, "stop")):
        dist.all_reduce(ones)
        if dist.get_rank() == 0:
            with open(events, "a") as out:
                out.write(f"{_time.time()} {dist.get_world_size()} {os.environ['TORCHELASTIC_RESTART_COUNT']}\n")
        _time.sleep(0.1)
    return 0


def first_step_at(folder, world, after):
    path = folder / "events.txt"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        stamp, size, _ = line.split()
        if float(stamp) > after and int(size) == world:
            return float(stamp)
    return None


def wait_for(folder, world, after, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        stamp = first_step_at(folder, world, after)
        if stamp is not None:
            return stamp
        time.sleep(0.2)
    raise TimeoutError(f"no step at world size {world} within {timeout} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--last-call", type=int, default=None, help="last_call_timeout (default: torch's, 30 s)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="membership-"))
    script = write_torchrun_script(log_steps, folder / "log_steps.py", args=(str(folder),))
    conf = [f"--rdzv-conf=last_call_timeout={args.last_call}"] if args.last_call is not None else []
    options = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
               "--rdzv-id=membership", "--max-restarts=5", *conf]
    env = {**os.environ, "COURSE_TORCHRUN_OUTPUT": str(folder), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
           "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    agents = []

    def start(name):
        agent = Agent([*TORCHRUN, *options, str(script)], folder / f"{name}.log")
        agent.start(env, cwd=folder)
        agents.append(agent)
        return agent

    try:
        start("a")
        b = start("b")
        wait_for(folder, 2, 0, 180)
        print("formed a job of world size 2")
        node_b = [psutil.Process(b.process.pid), *psutil.Process(b.process.pid).children(recursive=True)]
        killed_at = time.time()
        for proc in node_b:
            proc.kill()
        shrunk = wait_for(folder, 1, killed_at, 240)
        print(f"lost a node: world size 1 after {shrunk - killed_at:.1f} s")
        joined_at = time.time()
        c = start("c")
        grown = wait_for(folder, 2, joined_at, 240)
        print(f"a node joined: world size 2 after {grown - joined_at:.1f} s")
        worker = psutil.Process(c.process.pid).children(recursive=True)[0]
        os.kill(c.process.pid, signal.SIGKILL)  # only the agent
        time.sleep(3)
        print(f"killed only agent c: its worker is {'still running' if worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE else 'gone'}")
    finally:
        (folder / "stop").touch()
        _stop(agents, folder)


if __name__ == "__main__":
    main()
