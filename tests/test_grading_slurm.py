"""course-grade --slurm: a class graded as a job array on the course's real Slurm (course_lib/grading/on_slurm.py).

The class is tests/test_grading.py's small one (its fixture solutions, 2 ranks a check). Each test
needs a Slurm controller (``make slurm-up`` as root starts the course's one-machine cluster); without
one it skips and says why, unless ``COURSE_REQUIRE_SLURM=1`` (CI) makes that a failure. A task's
failure is made for real: the test cancels it with ``scancel`` as soon as the grader names its job.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from course_lib import slurm
from optional import skip_or_fail
from test_grading import (BASICS, CELL_TIMEOUT, COLLECTIVES, CORRECT, FIXTURES, WRONG_SUM, answered, exercise,
                          write)

REPO = Path(__file__).resolve().parents[1]
GRADE = [sys.executable, str(REPO / "scripts" / "grade.py")]


@pytest.fixture
def cluster():
    if not slurm.cluster_up():
        skip_or_fail(slurm.why_no_cluster(), "COURSE_REQUIRE_SLURM", "grading on Slurm")


@pytest.fixture
def place():
    """A folder for the class, its exercises and the secret; short, and removed after."""
    folder = Path(tempfile.mkdtemp(prefix="grading-slurm-"))
    exercises = folder / "exercises"
    exercises.mkdir()
    for name in (COLLECTIVES, BASICS):
        nbformat.write(exercise(name), exercises / name)
    (folder / "secret").write_text("3f1c0a9e5b7d4c2a8e6f1b3d5a7c9e0f\n")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def small_class(folder: Path) -> Path:
    """alice answers both notebooks right, bob hands in the exercise untouched, erin one wrong answer;
    carol hands in nothing (her notebooks are "missing" without a judge)."""
    write(folder, "alice", COLLECTIVES, answered(COLLECTIVES, CORRECT))
    write(folder, "alice", BASICS, answered(BASICS, CORRECT))
    write(folder, "bob", COLLECTIVES, exercise(COLLECTIVES))
    write(folder, "erin", COLLECTIVES, answered(COLLECTIVES, {**CORRECT, "sum_over_ranks": WRONG_SUM}))
    (folder / "carol").mkdir()
    return folder


def options(place: Path) -> list[str]:
    return ["--solutions", str(FIXTURES), "--exercises", str(place / "exercises"), "--cell-timeout",
            str(CELL_TIMEOUT), "--secret-file", str(place / "secret")]


def grade_on_slurm(submissions: Path, place: Path, *extra: str, cancel: int = 0, interrupt: bool = False):
    """course-grade --slurm, cancelling the first ``cancel`` jobs' task for share 1 (or interrupting the
    grader) as soon as it names them; its exit code and output."""
    command = [*GRADE, str(submissions), *options(place), "--slurm", *extra]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, cancelled = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            job = re.search(r"submitted (?:again as )?job (\d+)", line)
            if job and interrupt:
                proc.send_signal(signal.SIGINT)
            elif job and cancelled < cancel:
                subprocess.run(["scancel", f"{job.group(1)}_1"], check=True, timeout=30)
                cancelled += 1
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, "".join(lines)


def test_a_job_array_whose_task_failed_once_gives_the_one_machine_grades_byte_for_byte(cluster, place):
    one_machine = small_class(place / "one_machine")
    on_slurm = place / "on_slurm"
    shutil.copytree(one_machine, on_slurm, symlinks=True)
    local = subprocess.run([*GRADE, str(one_machine), *options(place)], capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stdout + local.stderr

    code, output = grade_on_slurm(on_slurm, place, "--slurm-tasks", "2", cancel=1)
    assert code == 0, output
    assert "submitted job" in output and re.search(r"share\(s\) 1 left no results .*: submitted again as job", output)
    comparison = filecmp.dircmp(one_machine, on_slurm)
    assert not comparison.left_only and not comparison.right_only, output  # the run's folder removed, too
    for student in ("alice", "bob", "erin", "carol"):
        for name in ("feedback.txt",):
            assert (one_machine / student / name).read_bytes() == (on_slurm / student / name).read_bytes(), student
    assert (one_machine / "grades.csv").read_bytes() == (on_slurm / "grades.csv").read_bytes()
    assert "alice,1,6,7,7,100.0,sandboxed" in (on_slurm / "grades.csv").read_text()
    assert "erin,0,4,4,7,57.1,sandboxed" in (on_slurm / "grades.csv").read_text()


def test_a_share_that_fails_twice_leaves_its_students_not_graded_and_says_why(cluster, place):
    submissions = place / "class"
    for student in ("carol", "dan", "eve"):  # nothing handed in: no judge needed, only the tasks
        (submissions / student).mkdir(parents=True)
    code, output = grade_on_slurm(submissions, place, "--slurm-tasks", "2", cancel=2)
    assert code == 0, output
    grades = (submissions / "grades.csv").read_text()
    feedback = (submissions / "dan" / "feedback.txt").read_text()
    assert "not graded: its grading task on Slurm failed twice" in feedback, feedback
    assert "ask your instructor to grade it again" in feedback
    assert "missing: no" in (submissions / "carol" / "feedback.txt").read_text()   # share 0 was graded
    assert "not graded" not in (submissions / "eve" / "feedback.txt").read_text()
    assert "dan,0,0,0,7,0.0,sandboxed" in grades
    assert not list(submissions.glob(".slurm-grading-*"))


def test_an_interrupted_run_goes_on_and_is_resumed_into_the_same_grades(cluster, place):
    submissions = place / "class"
    for student in ("carol", "dan"):
        (submissions / student).mkdir(parents=True)
    code, output = grade_on_slurm(submissions, place, interrupt=True)
    assert code == 130, output
    assert not (submissions / "grades.csv").exists()
    resume = re.search(r"course-grade --slurm-resume (\S+)", output)
    assert resume and "scancel" in output, output
    resumed = subprocess.run([*GRADE, "--slurm-resume", resume.group(1)], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "carol,0,0,0,7,0.0,sandboxed" in (submissions / "grades.csv").read_text()
    assert not Path(resume.group(1)).exists()


def test_bad_input_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "short").write_text("abc\n")
    refused = subprocess.run([*GRADE, str(tmp_path), "--secret-file", str(tmp_path / "short")],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "16 characters or more" in refused.stderr, refused.stderr
    not_a_run = subprocess.run([*GRADE, "--slurm-resume", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert not_a_run.returncode == 2 and "is not the folder of a --slurm run" in not_a_run.stderr
    nothing = subprocess.run(GRADE, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 2 and "name the folder of submissions" in nothing.stderr
    assert os.listdir(tmp_path) == ["short"]


def test_the_guides_command_grades_a_real_chapter_on_slurm(cluster, tmp_path):
    """docs/instructors.md's command as written, in a scratch course, on a class of one whose chapter 01
    exercise is handed in untouched: graded on a node, nothing earned, and feedback that says why."""
    from test_doc_commands import course_with_a_class_of_one, run_as_written

    course = course_with_a_class_of_one(tmp_path)
    run = run_as_written(".venv/bin/python scripts/grade.py SUBMISSIONS --slurm", course, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "as a Slurm job array of 1 task" in run.stdout and "submitted job" in run.stdout
    grades = (course / "SUBMISSIONS" / "grades.csv").read_text().splitlines()
    assert len(grades) == 2 and grades[1].startswith("ada,0,"), grades
    assert "FAILED" in (course / "SUBMISSIONS" / "ada" / "feedback.txt").read_text()


def test_slurm_options_without_slurm_and_a_resume_with_other_options_are_refused(tmp_path):
    alone = subprocess.run([*GRADE, str(tmp_path), "--slurm-tasks", "4"], capture_output=True, text=True, timeout=60)
    assert alone.returncode == 2 and "go with --slurm" in alone.stderr, alone.stderr
    mixed = subprocess.run([*GRADE, str(tmp_path), "--slurm-resume", str(tmp_path)], capture_output=True, text=True,
                           timeout=60)
    assert mixed.returncode == 2 and "takes the run's folder alone" in mixed.stderr, mixed.stderr
