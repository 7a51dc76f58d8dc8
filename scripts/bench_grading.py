"""How long grading a class takes: N submissions of one chapter, half solved, half untouched.

Usage: python scripts/bench_grading.py [--chapter 01_collectives] [--students 30] [--jobs N] [--max-batch 8]
                                      [--compare sandbox|batching]

Grades the same class twice, side by side, and prints both wall times, their ratio, and whether
the scores were right (solved: full marks, untouched: 0):
* ``--compare sandbox`` (default): every submission in its sandbox (grade.py's default), against
  ``--no-sandbox``. The target: the sandbox costs at most 1.5x.
* ``--compare batching``: one judge kernel per submission (--max-batch 1) against grade.py's
  default batching. The target: 30 submissions of one chapter in at most 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from course_lib.launcher import available_cpus  # noqa: E402


def grade_class(folder: Path, handed_out: Path, jobs: int, max_batch: int, sandbox: bool = True) -> tuple[float, int]:
    """Grade the class; return the wall time and how many students scored as expected."""
    for old in folder.glob("*/feedback.txt"):
        old.unlink()
    started = time.monotonic()
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(folder), "--exercises",
                          str(handed_out), "--jobs", str(jobs), "--max-batch", str(max_batch),
                          *([] if sandbox else ["--no-sandbox"])], capture_output=True, text=True)
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
    parser.add_argument("--compare", choices=["sandbox", "batching"], default="sandbox")
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
