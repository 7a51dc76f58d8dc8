"""How long grading a class takes: N submissions of one chapter, half solved, half untouched.

Usage: .venv/bin/python scripts/bench_grading.py [--chapter 01_collectives] [--students 30] [--jobs N] [--max-batch 8]
                                      [--compare sandbox|batching|revision|slurm] [--revision REF] [--rounds 2]
                                      [--slurm-tasks 2]

Grades the same class twice, side by side, and prints both wall times, their ratio, and whether
the scores were right (solved: full marks, untouched: 0):
* ``--compare sandbox`` (default): every submission in its sandbox (grade.py's default), against
  ``--no-sandbox``. The target: the sandbox costs at most 1.5x.
* ``--compare batching``: one judge kernel per submission (--max-batch 1) against grade.py's
  default batching. The target: 30 submissions of one chapter in at most 2 minutes on 2 cores.
* ``--compare revision --revision REF``: the grader of another commit (checked out into a temporary
  worktree, run with the same Python environment) against this tree's, in turns (``--rounds`` of
  each, alternating, so both meet the same load); the median of each. The target for a change to the
  grader: at most 1.1x.
* ``--compare slurm``: this machine with ``--jobs`` against a Slurm job array (``grade.py --slurm``) of
  ``--slurm-tasks`` tasks sharing the same jobs, both with one secret, so that the two grades.csv
  must be equal byte for byte (checked). Needs a Slurm cluster (``make slurm-up``); on the course's
  one-machine cluster the nodes share this machine's cores, so the ratio shows the job array's own
  cost, not a cluster's speed-up.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from course_lib.launcher import available_cpus  # noqa: E402


def grade_class(folder: Path, handed_out: Path, jobs: int, max_batch: int, sandbox: bool = True,
                tree: Path = REPO, extra: tuple[str, ...] = ()) -> tuple[float, int]:
    """Grade the class with the grader of ``tree``; return the wall time and how many students scored as expected."""
    for old in folder.glob("*/feedback.txt"):
        old.unlink()
    # The judge's kernel and the sandbox import course_lib from the tree's folder, not the installed one.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(tree / "scripts" / "grade.py"), str(folder), "--exercises",
                          str(handed_out), "--jobs", str(jobs), "--max-batch", str(max_batch),
                          *([] if sandbox else ["--no-sandbox"]), *extra], capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(run.stdout + run.stderr)
    with open(folder / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    maximum = float(rows[0]["max"])
    right = sum((float(row["total"]) == maximum) == (int(row["student"][-2:]) % 2 == 0) for row in rows)
    return seconds, right


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", default="01_collectives")
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=available_cpus())
    parser.add_argument("--max-batch", type=int, default=8, help="submissions per judge kernel (grade.py's default)")
    parser.add_argument("--compare", choices=["sandbox", "batching", "revision", "slurm"], default="sandbox")
    parser.add_argument("--slurm-tasks", type=int, default=2, help="with --compare slurm: the job array's tasks")
    parser.add_argument("--revision", default="HEAD", help="with --compare revision: the commit to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="with --compare revision: runs of each, alternating")
    options = parser.parse_args(argv)
    name = f"{options.chapter}.ipynb"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        for number in range(options.students):
            student = folder / f"student{number:02d}"
            student.mkdir(parents=True)
            source = REPO / ("solutions" if number % 2 == 0 else "exercises") / name
            shutil.copy(source, student / name)
        handed_out = Path(tmp) / "handed_out"
        handed_out.mkdir()
        shutil.copy(REPO / "exercises" / name, handed_out / name)
        if options.compare == "revision":
            return compare_revision(options, folder, handed_out)
        if options.compare == "slurm":
            return compare_slurm(options, folder, handed_out)
        if options.compare == "sandbox":  # side by side in one run: unconfined, then sandboxed
            plain, right_plain = grade_class(folder, handed_out, options.jobs, options.max_batch, sandbox=False)
            boxed, right_boxed = grade_class(folder, handed_out, options.jobs, options.max_batch)
        else:  # a judge kernel per submission, then several submissions per judge
            alone, right_alone = grade_class(folder, handed_out, options.jobs, 1)
            batched, right_batched = grade_class(folder, handed_out, options.jobs, options.max_batch)
    n = options.students
    print(f"{n} submissions of {name}, {options.jobs} jobs, {available_cpus()} cores, up to {options.max_batch} per judge:")
    if options.compare == "sandbox":
        print(f"  unconfined (--no-sandbox): {plain:6.1f} s ({plain / n:.2f} s per notebook), "
              f"{right_plain}/{n} scored as expected")
        print(f"  sandboxed:                 {boxed:6.1f} s ({boxed / n:.2f} s per notebook), "
              f"{right_boxed}/{n} scored as expected")
        print(f"  the sandbox costs {boxed / plain:.2f}x; target at most 1.5x: {'met' if boxed <= 1.5 * plain else 'NOT met'}")
        return 0 if right_plain == right_boxed == n else 1
    print(f"  one judge per submission:        {alone:6.1f} s ({alone / n:.2f} s per notebook), "
          f"{right_alone}/{n} scored as expected")
    print(f"  up to {options.max_batch} submissions per judge: {batched:6.1f} s ({batched / n:.2f} s per notebook), "
          f"{right_batched}/{n} scored as expected")
    thirty = batched if n == 30 else batched * 30 / n
    measured = "measured" if n == 30 else f"scaled from {n}"
    print(f"  speed-up {alone / batched:.2f}x; target: 30 in at most 120 s on 2 cores: {thirty:.0f} s "
          f"({measured}), {'met' if thirty <= 120 else 'NOT met'}")
    return 0 if right_alone == right_batched == n else 1


def compare_slurm(options, folder: Path, handed_out: Path) -> int:
    """The class graded on this machine, then as a job array with the same jobs in all and the same secret."""
    n, name, tasks = options.students, f"{options.chapter}.ipynb", max(1, options.slurm_tasks)
    secret = folder.parent / "secret"
    secret.write_text(os.urandom(16).hex() + "\n")
    same = ("--secret-file", str(secret))
    here, right_here = grade_class(folder, handed_out, options.jobs, options.max_batch, extra=same)
    grades_here = (folder / "grades.csv").read_bytes()
    per_task = max(1, options.jobs // tasks)
    array, right_array = grade_class(folder, handed_out, per_task, options.max_batch,
                                     extra=(*same, "--slurm", "--slurm-tasks", str(tasks)))
    equal = (folder / "grades.csv").read_bytes() == grades_here
    print(f"{n} submissions of {name}, {available_cpus()} cores, up to {options.max_batch} per judge, sandboxed:")
    here_label, array_label = f"this machine, {options.jobs} jobs:", f"job array, {tasks} tasks x {per_task} jobs:"
    width = max(len(here_label), len(array_label))
    print(f"  {here_label:<{width}} {here:6.1f} s ({here / n:.2f} s per notebook), "
          f"{right_here}/{n} scored as expected")
    print(f"  {array_label:<{width}} {array:6.1f} s ({array / n:.2f} s per notebook), "
          f"{right_array}/{n} scored as expected")
    print(f"  the job array takes {array / here:.2f}x; grades.csv {'identical' if equal else 'DIFFERENT'}")
    return 0 if right_here == right_array == n and equal else 1


def compare_revision(options, folder: Path, handed_out: Path) -> int:
    """The same class graded by another commit's grader and by this tree's, in turns; the medians and their ratio."""
    n, name = options.students, f"{options.chapter}.ipynb"
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "other"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), options.revision],
                       check=True, capture_output=True)
        try:
            times = {"other": [], "this": []}
            right = {"other": set(), "this": set()}
            for _ in range(max(1, options.rounds)):
                for which, tree in (("other", other), ("this", REPO)):
                    seconds, scored = grade_class(folder, handed_out, options.jobs, options.max_batch, tree=tree)
                    times[which].append(seconds)
                    right[which].add(scored)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], capture_output=True)
    before, after = statistics.median(times["other"]), statistics.median(times["this"])
    print(f"{n} submissions of {name}, {options.jobs} jobs, {available_cpus()} cores, up to {options.max_batch} "
          f"per judge, sandboxed, {options.rounds} rounds of each, alternating:")
    print(f"  {options.revision}: {', '.join(f'{t:.1f}' for t in times['other'])} s (median {before:.1f} s), "
          f"scored as expected: {sorted(right['other'])}/{n}")
    print(f"  this tree: {', '.join(f'{t:.1f}' for t in times['this'])} s (median {after:.1f} s), "
          f"scored as expected: {sorted(right['this'])}/{n}")
    print(f"  this tree takes {after / before:.2f}x; target at most 1.1x: {'met' if after <= 1.1 * before else 'NOT met'}")
    return 0 if right["other"] == right["this"] == {n} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
