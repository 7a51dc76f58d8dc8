"""How much one submission's busy processes slow the checks of a submission graded beside it.

Usage: .venv/bin/python scripts/bench_cpu_share.py [--rounds 2] [--spinners 100] [--checks 5]

Two judges run side by side, each with its sandbox, as ``grade.py --jobs 2`` runs them (each judge in a
session of its own). One times a check: a launch of two ranks that each multiply matrices for about a
second, ``--checks`` times, the median kept. The other, its neighbour, is a submission of one of two kinds:

* **honest**: it runs the same check over and over (an honest classmate graded at the same time);
* **hostile**: one answer cell leaves ``--spinners`` processes busy, each trying to start a session of
  its own (with the kernel's autogroups every session would get as much of the CPU as any other).

It prints the check's median time alone, beside each neighbour, and the ratio hostile/honest, in
rounds that alternate the two so both meet the same load. The target: at most 1.2x
(course_lib.confine.cgroups.cpu_sharing says how the CPU is shared on this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SETUP = "import os, sys, time\nimport torch"


def check_work(iterations):
    # One rank's share of a check: single-threaded matrix products, a fixed amount of work.
    import torch

    torch.set_num_threads(1)
    a = torch.randn(192, 192, generator=torch.Generator().manual_seed(0))
    for _ in range(iterations):
        a = torch.tanh(a @ a)
    return float(a.sum())


def spin_everywhere(n):
    # Forked from a bare Python (not the rank, which holds torch), each child tries setsid, then spins:
    # left behind when the call ends, until the sandbox ends.
    import subprocess
    import sys

    code = ("import os, sys\n"
            "for _ in range(int(sys.argv[1])):\n"
            "    if os.fork() == 0:\n"
            "        try:\n"
            "            os.setsid()\n"
            "        except OSError:\n"
            "            os.setpgid(0, 0)  # refused a session: out of the rank's process group at least\n"
            "        while True:\n"
            "            pass\n")
    subprocess.run([sys.executable, "-S", "-c", code, str(n)], check=True, timeout=60)
    return n


def judge_role(role: str, spinners: int, checks: int, iterations: int) -> None:
    """One judge: 'victim' prints its checks' times; 'honest' and 'hostile' say 'ready' and go on."""
    os.environ["COURSE_GRADING"] = "1"
    from course_lib.grading import judge

    judge.become_judge()
    learner = judge.Learner(answers=(), setup=SETUP)
    learner.call(os.getpid)  # the sandbox and its launch server started, outside the times
    if role == "hostile":
        learner.call(spin_everywhere, spinners)
        print("ready", flush=True)
        time.sleep(3600)
    if role == "honest":
        learner.launch(check_work, 2, args=(iterations,))
        print("ready", flush=True)
        while True:
            learner.launch(check_work, 2, args=(iterations,))
    times = []
    for _ in range(checks):
        started = time.perf_counter()
        learner.launch(check_work, 2, args=(iterations,))
        times.append(time.perf_counter() - started)
    print(json.dumps({"median_s": statistics.median(times), "times": times}), flush=True)


def start_judge(role: str, options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--role", role, "--spinners", str(options.spinners),
                             "--checks", str(options.checks), "--iterations", str(options.iterations)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)


def victims_median(neighbour: str | None, options) -> float:
    """The victim's median check time beside a neighbour of this kind (None: alone)."""
    beside = None
    if neighbour:
        beside = start_judge(neighbour, options)
        if beside.stdout.readline().strip() != "ready":
            raise SystemExit(f"the {neighbour} neighbour did not start: exit {beside.wait()}")
    try:
        victim = start_judge("victim", options)
        out, _ = victim.communicate(timeout=1200)
        if victim.returncode != 0:
            raise SystemExit(f"the timed judge failed: exit {victim.returncode}")
        return json.loads(out.strip().splitlines()[-1])["median_s"]
    finally:
        if beside is not None:
            beside.kill()  # its sandbox dies with it (bwrap --die-with-parent): every spinner too
            beside.wait()


def machine_line() -> str:
    from course_lib.confine.cgroups import cgroup_roots, cpu_sharing

    how, why = cpu_sharing(cgroup_roots() if os.geteuid() == 0 else None)
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} cores, load {load:.2f} (1 min), {'root' if os.geteuid() == 0 else 'ordinary user'}; "
            f"CPU shared by {how or 'nothing'}: {why}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--spinners", type=int, default=100)
    parser.add_argument("--checks", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--role", choices=["victim", "honest", "hostile"], help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.role:
        judge_role(options.role, options.spinners, options.checks, options.iterations)
        return 0
    print(machine_line(), flush=True)
    found = {"alone": [], "honest": [], "hostile": []}
    for round_number in range(options.rounds):
        for neighbour in (None, "honest", "hostile"):
            seconds = victims_median(neighbour, options)
            found[neighbour or "alone"].append(seconds)
            print(f"round {round_number + 1}: the check beside {neighbour or 'nobody'}: {seconds:.2f} s", flush=True)
    medians = {kind: statistics.median(values) for kind, values in found.items()}
    print(f"check alone {medians['alone']:.2f} s | beside an honest classmate {medians['honest']:.2f} s | "
          f"beside {options.spinners} busy processes {medians['hostile']:.2f} s")
    ratio = medians["hostile"] / medians["honest"]
    print(f"hostile / honest neighbour: {ratio:.2f}x (target: at most 1.2x) -> {'met' if ratio <= 1.2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
