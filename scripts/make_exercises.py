"""Generate exercises/ from solutions/: ``.venv/bin/python scripts/make_exercises.py [--check]`` (see
course_lib/grading/exercises.py, which the grader uses too)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the course, when not installed

from course_lib.grading.exercises import (  # noqa: E402,F401
    STUB, generate, main, make_exercise, read_notebook, render, solution_paths, stale_files)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
