"""Why chapter 01 calls dist.barrier() before dist.destroy_process_group(), counted.

    .venv/bin/python scripts/bench_teardown.py [--launches 40] [--learners 3] [--busy 2]

Chapter 01's first cell joins the process group by hand and leaves it again without any
collective in between. init_process_group returns on a rank once *its* side of every gloo
connection is set up; a slower peer may still be finishing its side, and a rank that destroys
the group at once closes a connection under it: the peer's init_process_group fails with
"Connection closed by peer". The script runs that function the way a crowded classroom does
(--learners processes launching 4 ranks each, over and over, beside --busy loops that each keep
a core busy), first without the barrier, then with it, and prints how many launches failed each
way, measured in this one run. A benchmark, not a test: how often the race strikes depends on
the machine and its load.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one_learner(with_barrier: bool, launches: int, queue) -> None:
    from course_lib import WorkerError, launch

    def join_and_leave(with_barrier: bool) -> int:  # defined here: sent by value, as a notebook's are
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")
        rank = dist.get_rank()
        if with_barrier:
            dist.barrier()
        dist.destroy_process_group()
        return rank

    failures = []
    for _ in range(launches):
        try:
            launch(join_and_leave, world_size=4, args=(with_barrier,), init_process_group=False,
                   show_output=False, timeout=120)
        except WorkerError as error:
            failures.append(str(error).splitlines()[0])
    queue.put(failures)


def busy_loop() -> None:
    while True:
        pass


def count_failures(with_barrier: bool, launches: int, learners: int, busy: int) -> list[str]:
    ctx = mp.get_context("spawn")  # each learner gets its own fresh interpreter, as kernels do
    queue = ctx.Queue()
    loops = [ctx.Process(target=busy_loop, daemon=True) for _ in range(busy)]
    for loop in loops:
        loop.start()
    try:
        learners_ = [ctx.Process(target=one_learner, args=(with_barrier, launches, queue)) for _ in range(learners)]
        for learner in learners_:
            learner.start()
        failures = sum((queue.get(timeout=3600) for _ in learners_), [])
        for learner in learners_:
            learner.join()
    finally:
        for loop in loops:
            loop.kill()
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=40, help="launches per learner and way")
    parser.add_argument("--learners", type=int, default=3, help="processes launching at once")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside them")
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as in the course's hub: cores are shared
    total = args.launches * args.learners
    print(f"{args.learners} learners x {args.launches} launches of 4 ranks, {args.busy} busy loops, "
          f"{os.cpu_count()} cores")
    for with_barrier in (False, True):
        failures = count_failures(with_barrier, args.launches, args.learners, args.busy)
        way = "barrier, then destroy" if with_barrier else "destroy at once     "
        print(f"  {way}: {len(failures):3d} of {total} launches failed")
        for line in sorted(set(f[:160] for f in failures))[:3]:
            print(f"      {line}")


if __name__ == "__main__":
    main()
