"""Many learners' first launches at the same moment, beside busy loops: does one ever fail by chance?

Usage: .venv/bin/python scripts/launch_stress.py [--learners 4] [--rounds 50] [--busy 2] [--ranks 4]

Each round starts --learners fresh Python processes together, each what a learner's new kernel does
first: import the course's launcher and run its first launch (--ranks ranks join a gloo process group
and all-reduce their rank numbers; the sum is checked). Beside them, --busy processes spin on the
CPU for the whole run, as a browser, a video call or a neighbour's training would. Every failure is
printed with the learner's last lines of error output; the last line is the failure rate. Exit 1 if
any launch failed. A stress test, not a benchmark: it runs until all rounds are done (a few seconds
a round on 2 cores).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LEARNER = """
import sys, time
started = time.perf_counter()
import torch, torch.distributed as dist
from course_lib.launcher import launch

def first_cell():
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    return total.item()

ranks = int(sys.argv[1])
sums = launch(first_cell, ranks, show_output=False, live=False, timeout=120, startup_timeout=120)
assert sums == [ranks * (ranks - 1) / 2] * ranks, sums
print(f"{time.perf_counter() - started:.2f}")
"""


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def one_round(learners: int, ranks: int, limit_s: float) -> list[tuple[bool, str]]:
    # Each learner is a user of their own, with a launch server of their own (one user's kernels share one:
    # course_lib/launcher/shared_server.py); here all run as one user, so each gets a runtime folder.
    runtimes = [tempfile.mkdtemp(prefix="rt-", dir="/tmp") for _ in range(learners)]
    started = [subprocess.Popen([sys.executable, "-c", LEARNER, str(ranks)], cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=str(REPO), XDG_RUNTIME_DIR=runtime),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for runtime in runtimes]
    outcomes = []
    for process in started:
        try:
            out, err = process.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            outcomes.append((False, f"no answer in {limit_s:g} s\n{err}"))
            continue
        outcomes.append((process.returncode == 0, out.strip() if process.returncode == 0 else err))
    for runtime in runtimes:
        shutil.rmtree(runtime, ignore_errors=True)
    return outcomes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", type=int, default=4, help="learners starting together each round")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside them")
    parser.add_argument("--ranks", type=int, default=4, help="ranks in each learner's launch")
    options = parser.parse_args(argv)
    print(f"{options.rounds} rounds of {options.learners} learners' first launch ({options.ranks} ranks, gloo) "
          f"beside {options.busy} busy loops, on {os.cpu_count()} cores", flush=True)
    busy = [mp.Process(target=spin, args=(time.time() + 24 * 3600,), daemon=True) for _ in range(options.busy)]
    for process in busy:
        process.start()
    failures, seconds = [], []
    try:
        for number in range(1, options.rounds + 1):
            for ok, detail in one_round(options.learners, options.ranks, limit_s=300):
                if ok:
                    seconds.append(float(detail))
                else:
                    failures.append(detail)
                    tail = "\n    ".join(detail.strip().splitlines()[-6:])
                    print(f"round {number}: a learner failed:\n    {tail}", flush=True)
            if number % 10 == 0:
                print(f"  {number} rounds, {len(failures)} failed so far", flush=True)
    finally:
        for process in busy:
            process.terminate()
    launches = options.rounds * options.learners
    seconds.sort()
    if seconds:
        print(f"a learner's start to its first launch's answer: median {seconds[len(seconds) // 2]:.1f} s, "
              f"slowest {seconds[-1]:.1f} s")
    print(f"{len(failures)} of {launches} first launches failed ({100 * len(failures) / launches:.1f}%)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
