"""Grade a class's exercise notebooks: ``.venv/bin/python scripts/grade.py SUBMISSIONS`` (also ``course-grade``).

Every part of grading lives in course_lib/grading/: the command line (grader.py) and its steps
(merging.py, running.py, scoring.py, reporting.py), the judge (judge.py), the sandbox each
submission runs in (sandbox.py), the checks' messages (checks.py), the verdicts plugin
(verdicts.py) and the exercises' stubs (exercises.py).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the course, when not installed

from course_lib.grading.grader import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
