"""How long grading a class takes: N submissions of one chapter, half solved, half untouched.

Usage: python scripts/bench_grading.py [--chapter 01_collectives] [--students 30] [--jobs N]

Prints the wall time, the time per notebook, and whether the scores were right (solved: full
marks, untouched: 0). The target: 30 submissions of one chapter in at most 2 minutes on 2 cores.
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


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", default="01_collectives")
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=available_cpus())
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
        started = time.monotonic()
        run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(folder), "--exercises",
                              str(handed_out), "--jobs", str(options.jobs)], capture_output=True, text=True)
        seconds = time.monotonic() - started
        if run.returncode != 0:
            print(run.stdout, run.stderr)
            return 1
        with open(folder / "grades.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        maximum = float(rows[0]["max"])
        right = sum((float(row["total"]) == maximum) == (int(row["student"][-2:]) % 2 == 0) for row in rows)
    print(f"{options.students} submissions of {name}, {options.jobs} jobs, {available_cpus()} cores: "
          f"{seconds:.1f} s in all, {seconds / options.students:.2f} s per notebook; "
          f"{right}/{options.students} scored as expected (target: 30 in at most 120 s on 2 cores)")
    return 0 if right == options.students else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
