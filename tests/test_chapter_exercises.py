"""The real chapters' exercises: untouched they fail every check, solved they pass every check."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXERCISES = sorted((REPO / "exercises").glob("*.ipynb"))


def points_possible(solution: Path) -> int:
    cells = json.loads(solution.read_text())["cells"]
    return sum(int(c["metadata"].get("nbgrader", {}).get("points", 0)) for c in cells
               if c["metadata"].get("nbgrader", {}).get("grade"))


def test_untouched_exercises_score_zero_and_solutions_full_marks(tmp_path):
    assert EXERCISES, "no exercise notebooks found"
    for student, source in (("untouched", REPO / "exercises"), ("solved", REPO / "solutions")):
        (tmp_path / student).mkdir()
        for exercise in EXERCISES:
            shutil.copy(source / exercise.name, tmp_path / student / exercise.name)
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    for exercise in EXERCISES:
        name, possible = exercise.stem, points_possible(REPO / "solutions" / exercise.name)
        assert possible > 0, f"{name} has no graded checks"
        assert float(rows["untouched"][name]) == 0, f"an untouched {name} earned points:\n{run.stdout}"
        assert float(rows["solved"][name]) == possible, f"the solution of {name} lost points:\n{run.stdout}"
    feedback = (tmp_path / "untouched" / "feedback.txt").read_text()
    assert "not implemented yet" in feedback
