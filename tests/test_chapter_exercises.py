"""The real chapters' exercises, graded as a class would be.

For every chapter with an exercise, one grading run takes four kinds of student:
- untouched: the exercise as handed out, which must earn nothing;
- solved: the solution notebook, which must earn full marks;
- tests/submissions/<chapter>/wrong*.ipynb: answers that are wrong in plausible ways
  (the mistakes learners really make), each of which must score 0 on every check;
- tests/submissions/<chapter>/unusual*.ipynb: correct answers reached another way
  (another algorithm, API or naming), which must earn full marks.
"""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXERCISES = sorted((REPO / "exercises").glob("*.ipynb"))
SUBMISSIONS = Path(__file__).resolve().parent / "submissions"


def points_possible(solution: Path) -> int:
    cells = json.loads(solution.read_text())["cells"]
    return sum(int(c["metadata"].get("nbgrader", {}).get("points", 0)) for c in cells
               if c["metadata"].get("nbgrader", {}).get("grade"))


def answer_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["metadata"].get("nbgrader", {}).get("solution")]


def test_every_chapter_has_wrong_and_unusual_submissions():
    for exercise in EXERCISES:
        folder = SUBMISSIONS / exercise.stem
        assert list(folder.glob("wrong*.ipynb")), f"no wrong-but-plausible submission for {exercise.stem}"
        assert list(folder.glob("unusual*.ipynb")), f"no unusual correct submission for {exercise.stem}"


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda path: path.stem)
def test_grading_rewards_right_answers_and_only_them(exercise, tmp_path):
    name, solution = exercise.stem, REPO / "solutions" / exercise.name
    possible = points_possible(solution)
    assert possible > 0, f"{name} has no graded checks"
    students = {"untouched": exercise, "solved": solution}
    for submission in sorted((SUBMISSIONS / name).glob("*.ipynb")):
        assert answer_cells(submission) != answer_cells(solution), f"{submission.name} is the solution itself"
        students[submission.stem] = submission
    handed_out = tmp_path / "handed_out"
    handed_out.mkdir()
    shutil.copy(exercise, handed_out / exercise.name)
    for student, source in students.items():
        (tmp_path / "class" / student).mkdir(parents=True)
        shutil.copy(source, tmp_path / "class" / student / exercise.name)
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path / "class"),
                          "--exercises", str(handed_out), "--jobs", "2"],
                         capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    with open(tmp_path / "class" / "grades.csv", newline="") as f:
        scores = {row["student"]: float(row[name]) for row in csv.DictReader(f)}
    feedback = {student: (tmp_path / "class" / student / "feedback.txt").read_text() for student in students}
    for student, score in scores.items():
        if student == "untouched" or student.startswith("wrong"):
            assert score == 0, f"{student} earned {score} of {possible} in {name}:\n{feedback[student]}"
        else:
            assert score == possible, f"{student} earned {score} of {possible} in {name}:\n{feedback[student]}"
    assert "not implemented yet" in feedback["untouched"]
