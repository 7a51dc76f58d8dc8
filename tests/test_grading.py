"""scripts/grade.py on a small class of synthetic submissions, with exact expected scores.

The reference notebooks are tests/fixtures/solutions/ (three exercises on 2 processes with a
5 s launch timeout, and one single-process exercise). One grading run covers every case; the
tests below read its table, feedback files and process list.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import nbformat
import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "solutions"
sys.path.insert(0, str(REPO / "scripts"))
from make_exercises import make_exercise, read_notebook  # noqa: E402

# The fixture's checks give up after 5 s, well inside this; and its setup cell (imports, the Learner) must
# finish inside it too: 12 s was not enough on the 2-core machine beside the class's grading and the browser.
# An answer cell gets half of it, and a submission's first answer cell also waits for its sandbox's launch
# server to import torch: beside the sandboxed class grading (load average 9 on 2 cores) 15 s was not enough
# for that. The root fix, starting each sandbox in the grader's own between-submissions cell, is not built yet.
CELL_TIMEOUT = 60
COLLECTIVES, BASICS = "tiny_collectives.ipynb", "tiny_basics.ipynb"

# Answers as a student would type them into the exercise's answer cells.
CORRECT = {
    "sum_over_ranks": "def sum_over_ranks():\n    value = torch.tensor([dist.get_rank() + 1.0])\n"
                      "    dist.all_reduce(value)\n    return value",
    "share_from_rank0": "def share_from_rank0():\n    tensor = torch.tensor([10.0 * dist.get_rank(), 1.0])\n"
                        "    dist.broadcast(tensor, src=0)\n    return tensor",
    "world_size_seen": "def world_size_seen():\n    return dist.get_world_size()",
    "double": "def double(x):\n    return x + x",
}
WRONG_SUM = ("def sum_over_ranks():\n    value = torch.tensor([dist.get_rank() + 1.0])\n"
             "    dist.all_reduce(value, op=dist.ReduceOp.MAX)\n    return value")
# Passes the visible check (rank 1's tensor) but not the hidden one (rank 0's).
SHARE_ONLY_RANK1 = ("def share_from_rank0():\n    tensor = torch.tensor([10.0 * dist.get_rank(), 1.0])\n"
                    "    dist.broadcast(tensor, src=0)\n    return tensor if dist.get_rank() == 1 else tensor * 5")
DEADLOCK = ("def sum_over_ranks():\n    value = torch.tensor([dist.get_rank() + 1.0])\n"
            "    if dist.get_rank() == 0:\n        dist.all_reduce(value)  # rank 1 never joins\n    return value")
INFINITE_LOOP_CELL = "while True:  # never ends\n    pass\n" + CORRECT["share_from_rank0"]
UNINTERRUPTIBLE_LOOP_CELL = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                             "while True:\n    pass")
# A learner hunting for points without answering: swallow every check's failure, silence the
# comparisons, send back a pickle that would run a command in whoever unpickles it, and read
# the calling frame's locals for expected values. None of it reaches the judge.
PWNED = Path("/tmp") / f"course-grading-pwned-{uuid.uuid4().hex}"
TAMPER_CHECKS_CELL = f"""\
import contextlib, os, pickle, sys
import course_lib, course_lib.grading, course_lib.grading.checks as checks_module, course_lib.launcher as launcher

@contextlib.contextmanager
def checking(what):
    try:
        yield
    except BaseException:
        pass

checks_module.checking = course_lib.checking = course_lib.grading.checking = checking
checks_module.expect_close = course_lib.expect_close = lambda *args, **kwargs: None

class Payload:
    def __reduce__(self):
        return os.system, ("touch {PWNED}",)

launcher.worker._data_payload = lambda result: pickle.dumps(Payload())

def share_from_rank0():
    seen = sys._getframe(1).f_locals
    return torch.tensor([float(len(seen)), 0.0])
"""
# ... and kill the judge (the launch server's parent): as root the grader runs answers as
# nobody, so the kill fails; otherwise the judge dies. Either way: no points, others graded.
KILL_JUDGE_CELL = """\
import contextlib, os, signal
with contextlib.suppress(Exception):
    with open(f"/proc/{os.getppid()}/stat") as stat:
        judge = int(stat.read().rsplit(")", 1)[1].split()[1])
    os.kill(judge, signal.SIGKILL)

def world_size_seen():
    return 3
"""

# Answers that only raise, with errors the kernel cannot send to nbval: a lone surrogate in the message
# (not encodable as UTF-8), an exception whose __str__ raises. nbval saw no error in the check cells they
# reached; only the judge's sealed record of how each cell ended shows them (course_lib.grading.proof).
UNSENDABLE_ERRORS = {
    "sum_over_ranks": 'def sum_over_ranks():\n    raise ValueError("\\ud800")',
    "share_from_rank0": ("class Unreadable(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\n"
                         "def share_from_rank0():\n    raise Unreadable()"),
    "world_size_seen": 'def world_size_seen():\n    raise KeyError("\\udcff\\ud800")',
    "double": 'def double(x):\n    raise ValueError("\\ud800" * 3)',
}

# student -> {notebook: expected points}; max is 6 (2 + 3 + 1) and 1.
EXPECTED = {
    "alice": {COLLECTIVES: 6, BASICS: 1},     # everything right
    "bob": {COLLECTIVES: 0, BASICS: 0},       # handed back the untouched exercise; basics missing
    "dave": {COLLECTIVES: 1, BASICS: 0},      # deadlock, infinite loop, then a right answer
    "erin": {COLLECTIVES: 3, BASICS: 0},      # wrong sum with its check edited to `pass`, deleted a check
    "frank": {COLLECTIVES: 0, BASICS: 0},     # collectives "notebook" is not a notebook; basics missing
    "grace": {COLLECTIVES: 1, BASICS: 0},     # visible check passes, hidden fails; endless loop ignoring SIGINT
    "mallory": {COLLECTIVES: 2, BASICS: 0},   # one right answer; tampering and killing the judge for the others
    "trent": {COLLECTIVES: 0, BASICS: 0},     # a link to alice's notebook, a named pipe, feedback.txt a link
    "oscar": {COLLECTIVES: 0, BASICS: 0},     # every answer raises an error the kernel cannot send to nbval
}
MAX = {COLLECTIVES: 6, BASICS: 1}


def exercise(name: str) -> nbformat.NotebookNode:
    return make_exercise(read_notebook(FIXTURES / name))


def answered(name: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    """The exercise notebook with some answer cells filled in, as a student hands it in."""
    notebook = exercise(name)
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell.source = answers[grade_id]
    return notebook


def cell_with_id(notebook, grade_id):
    return next(c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def write(folder: Path, student: str, name: str, notebook) -> None:
    (folder / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, folder / student / name)


def make_class(folder: Path) -> None:
    write(folder, "alice", COLLECTIVES, answered(COLLECTIVES, CORRECT))
    write(folder, "alice", BASICS, answered(BASICS, CORRECT))

    write(folder, "bob", COLLECTIVES, exercise(COLLECTIVES))
    (folder / "bob" / "scratch.ipynb").write_text("{}")  # not an exercise: ignored

    write(folder, "dave", COLLECTIVES, answered(COLLECTIVES, {
        **CORRECT, "sum_over_ranks": DEADLOCK, "share_from_rank0": INFINITE_LOOP_CELL}))

    erin = answered(COLLECTIVES, {**CORRECT, "sum_over_ranks": WRONG_SUM})
    cell_with_id(erin, "check_sum_over_ranks").source = "pass"  # edited check: still graded
    erin.cells.remove(cell_with_id(erin, "check_share_from_rank0"))  # deleted check: still graded
    erin.cells.remove(cell_with_id(erin, "world_size_seen"))  # deleted answer: graded as the stub
    write(folder, "erin", COLLECTIVES, erin)
    basics = answered(BASICS, CORRECT)
    cell_with_id(basics, "check_double").source = "# NBVAL_SKIP\npass"
    basics.cells.remove(cell_with_id(basics, "double"))
    write(folder, "erin", BASICS, basics)

    (folder / "frank").mkdir()
    (folder / "frank" / COLLECTIVES).write_text("this is not a notebook\n")

    grace = answered(COLLECTIVES, {**CORRECT, "share_from_rank0": SHARE_ONLY_RANK1,
                                   "sum_over_ranks": UNINTERRUPTIBLE_LOOP_CELL})
    write(folder, "grace", COLLECTIVES, grace)
    (folder / "grace" / BASICS).write_text('{"cells": "no", "nbformat": 4}')  # JSON, wrong format

    write(folder, "mallory", COLLECTIVES, answered(COLLECTIVES, {
        **CORRECT, "share_from_rank0": TAMPER_CHECKS_CELL, "world_size_seen": KILL_JUDGE_CELL}))

    write(folder, "oscar", COLLECTIVES, answered(COLLECTIVES, UNSENDABLE_ERRORS))
    write(folder, "oscar", BASICS, answered(BASICS, UNSENDABLE_ERRORS))

    # Links survive `cp -r` (the instructors' guide collects with it): trent hands in alice's notebook
    # through one, and plants feedback.txt as a link to her other notebook, which writing the feedback
    # through it would destroy. A named pipe would stop the class at the read. sybil's whole folder
    # is a link to alice's.
    (folder / "trent").mkdir()
    (folder / "trent" / COLLECTIVES).symlink_to(Path("..") / "alice" / COLLECTIVES)
    os.mkfifo(folder / "trent" / BASICS)
    (folder / "trent" / "feedback.txt").symlink_to(folder / "alice" / BASICS)
    (folder / "sybil").symlink_to(folder / "alice", target_is_directory=True)


@pytest.fixture(scope="module")
def graders_temporary_folder():
    """grade.py's TMPDIR: short (a socket's path below it holds at most 107 bytes), and checked empty after."""
    folder = Path(tempfile.mkdtemp())
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, graders_temporary_folder):
    folder = tmp_path_factory.mktemp("submissions")
    make_class(folder)
    exercises = tmp_path_factory.mktemp("exercises")
    for name in (COLLECTIVES, BASICS):
        nbformat.write(exercise(name), exercises / name)
    token = uuid.uuid4().hex
    env = dict(os.environ, COURSE_GRADING_TEST_TOKEN=token, TMPDIR=str(graders_temporary_folder))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "grade.py"), str(folder), "--solutions", str(FIXTURES),
         "--exercises", str(exercises), "--cell-timeout", str(CELL_TIMEOUT), "--jobs", "4"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    seconds = time.monotonic() - started
    print(proc.stdout, proc.stderr, f"graded in {seconds:.1f} s", sep="\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (folder / ".grade-stderr.txt").write_text(proc.stderr)  # a file, not a folder: no student
    return folder, proc.stdout, token


def read_grades(folder: Path) -> tuple[list[str], dict[str, dict[str, str]]]:
    with open(folder / "grades.csv", newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    return header, {row[0]: dict(zip(header, row)) for row in rows[1:]}


def test_csv_header_and_exact_scores(graded):
    folder, _, _ = graded
    header, rows = read_grades(folder)
    assert header == ["student", "tiny_basics", "tiny_collectives", "total", "max", "percent", "grading"]
    assert sorted(rows) == sorted(EXPECTED)
    assert {row["grading"] for row in rows.values()} == {"sandboxed"}
    for student, expected in EXPECTED.items():
        row = rows[student]
        got = {COLLECTIVES: float(row["tiny_collectives"]), BASICS: float(row["tiny_basics"])}
        assert got == expected, f"{student}: {row}"
        total, possible = sum(expected.values()), sum(MAX.values())
        assert float(row["total"]) == total and float(row["max"]) == possible == 7
        assert row["percent"] == f"{100 * total / possible:.1f}"


def test_table_printed(graded):
    _, stdout, _ = graded
    table = stdout[stdout.index("student"):]
    assert "tiny_collectives" in table and "percent" in table
    assert any(line.split()[:1] == ["alice"] and line.split()[-3:] == ["7", "100.0", "sandboxed"]
               for line in table.splitlines())


def feedback(folder: Path, student: str) -> str:
    return (folder / student / "feedback.txt").read_text()


def test_feedback_says_what_passed_and_why_not(graded):
    folder, _, _ = graded
    alice = feedback(folder, "alice")
    assert "7 of 7 points" in alice and "FAILED" not in alice
    assert "[2/2] sum over 2 ranks: passed" in alice

    bob = feedback(folder, "bob")
    assert "not implemented yet" in bob and "0 of 7 points" in bob

    assert "missing: no tiny_basics.ipynb" in bob
    assert "Not graded: scratch.ipynb" in bob

    dave = feedback(folder, "dave")
    assert "did not finish in time" in dave  # the deadlock, caught by the launch timeout
    assert "did not finish within" in dave  # the endless loop, stopped on the learner side

    erin = feedback(folder, "erin")
    assert "[0/2] sum over 2 ranks: FAILED" in erin and "rank 0's result" in erin  # the reference check ran
    assert "[3/3] broadcast from rank 0: passed" in erin  # the deleted check ran too
    assert "answer cell 'world_size_seen' was not found" in erin

    frank = feedback(folder, "frank")
    assert "not a notebook" in frank

    grace = feedback(folder, "grace")
    assert "did not finish within" in grace  # a loop that ignores SIGINT never ran in the judge
    assert "tiny_basics.ipynb: 0 of 1 points" in grace and "no list of cells" in grace


def test_a_pass_is_proven_an_error_nbval_never_saw_fails(graded):
    folder, _, _ = graded
    oscar = feedback(folder, "oscar")
    assert "0 of 7 points" in oscar, oscar
    assert oscar.count("FAILED") == 4 and "passed" not in oscar, oscar
    assert "ValueError" in oscar and "KeyError" in oscar, oscar  # the judge's record names each error


def test_tampering_never_reaches_the_judge(graded):
    folder, _, _ = graded
    mallory = feedback(folder, "mallory")
    assert "[2/2] sum over 2 ranks: passed" in mallory
    assert "[0/3] broadcast from rank 0: FAILED" in mallory and "[0/1] world size: FAILED" in mallory
    assert not PWNED.exists(), "a learner's pickle ran code in the judge"


def test_feedback_never_shows_hidden_test_source(graded):
    folder, _, _ = graded
    hidden_source = ["hidden_probe_rank1", "BEGIN HIDDEN", "expect_close(results[0]", "double(torch.tensor([-1.5]))"]
    for student in EXPECTED:
        text = feedback(folder, student)
        assert "Traceback" not in text and "\x1b[" not in text, student
        for secret in hidden_source:
            assert secret not in text, (student, secret)
    # A hidden check's message (written for students) is shown.
    assert "rank 0's result" in feedback(folder, "grace")


def test_no_process_left_behind(graded):
    _, _, token = graded
    time.sleep(0.5)
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.environ().get("COURSE_GRADING_TEST_TOKEN") == token:
                left.append(proc.info)
        except (psutil.Error, OSError):
            continue
    assert left == []


def test_no_file_left_in_the_temporary_folder(graded, graders_temporary_folder):
    # Judges' kernels are killed when their run ends; what they made there (a launch server's socket
    # folder, the sandboxes' folders) goes with the folder the grader gave each run.
    from test_nothing_left_behind import kept

    left = kept(graders_temporary_folder)
    assert left == [], f"grade.py left {left} in its TMPDIR"


def test_links_and_pipes_in_a_submission_are_refused_never_followed(graded):
    folder, _, _ = graded
    _, grades = read_grades(folder)
    assert "sybil" not in grades  # a linked folder is nobody's
    assert "sybil is a symbolic link, not a student's folder: not graded" in (folder / ".grade-stderr.txt").read_text()
    assert not (folder / "trent" / "feedback.txt").is_symlink()  # replaced by trent's own feedback
    text = feedback(folder, "trent")
    assert f"{COLLECTIVES} is a symbolic link, not the notebook itself" in text
    assert f"{BASICS} is not a plain file" in text
    # the link's target, alice's notebook, is untouched: still the notebook she handed in
    assert nbformat.read(folder / "alice" / BASICS, as_version=4) == answered(BASICS, CORRECT)


def test_invalid_arguments_fail_cleanly(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a folder" in proc.stderr


def test_without_a_sandbox_grade_py_refuses_and_says_what_to_install(tmp_path):
    (tmp_path / "alice").mkdir()
    env = dict(os.environ, PATH="/nonexistent")  # bwrap cannot be found
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "`bwrap` was not found" in proc.stderr and "apt-get install bubblewrap" in proc.stderr
    assert "--no-sandbox" in proc.stderr
    assert not (tmp_path / "grades.csv").exists()


def test_unconfined_grading_says_so_on_every_line(tmp_path):
    folder, exercises = tmp_path / "class", tmp_path / "exercises"
    exercises.mkdir()
    nbformat.write(exercise(BASICS), exercises / BASICS)
    for student in ("ann", "ben"):
        (folder / student).mkdir(parents=True)
        nbformat.write(exercise(BASICS), folder / student / BASICS)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(folder), "--solutions",
                           str(FIXTURES), "--exercises", str(exercises), "--no-sandbox", "--jobs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith(("ann ", "ben "))]
    assert len(table) == 2 and all(line.rstrip().endswith("not sandboxed") for line in table), proc.stdout
    reports = [line for line in proc.stdout.splitlines() if line.startswith(("  ann/", "  ben/"))]
    assert len(reports) == 2 and all("not sandboxed" in line for line in reports), proc.stdout
    _, rows = read_grades(folder)
    assert {row["grading"] for row in rows.values()} == {"not sandboxed"}


def test_merge_takes_answers_by_grade_id_and_checks_from_reference():
    sys.path.insert(0, str(REPO / "scripts"))
    from course_lib.grading import grader as grade

    reference = grade.load_reference(FIXTURES / COLLECTIVES)
    assert [c.points for c in reference.checks] == [2, 3, 1]
    assert [c.label for c in reference.checks] == ["sum over 2 ranks", "broadcast from rank 0", "world size"]
    submission = answered(COLLECTIVES, {"sum_over_ranks": "# NBVAL_SKIP\nmine = 1"})
    cell_with_id(submission, "check_sum_over_ranks").source = "pass"
    merged, notes = grade.merge(reference, grade.student_answers(submission))
    sources = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in merged.cells}
    # The answer travels as text to the learner side: the judge's cell runs none of it, and a
    # marker inside it (here NBVAL_SKIP) is only text, never a marker of the graded cell.
    answer_cell = sources["sum_over_ranks"]
    assert answer_cell.startswith("# Added by the grader") and '"# NBVAL_SKIP\\nmine = 1"' in answer_cell
    assert not any(grade.NBVAL_MARKER.match(line) for line in answer_cell.splitlines())
    assert "BEGIN HIDDEN TESTS" in sources["check_sum_over_ranks"]
    assert notes == []
    assert all(c.execution_count is not None and c.outputs == [] for c in merged.cells if c.cell_type == "code")
    original = copy.deepcopy(reference.notebook)
    grade.merge(reference, {})
    assert reference.notebook == original  # merging never changes the reference


def test_one_judge_forgets_each_submission_before_the_next():
    # grade.py grades several submissions with one judge kernel; between two, nothing a check
    # bound for the first (or the answer cells it recorded) may remain for the second.

    from course_lib.grading import judge

    shell = SimpleNamespace(user_ns={"learner": None, "CHECK_TIMEOUT": 15, "_i3": "history"})
    learner = judge.Learner.__new__(judge.Learner)
    learner.cells, learner.broken, learner.shell, learner.grading = {}, {}, shell, False
    saved = dict(judge._state)
    try:
        judge._state.update(learner=learner, namespace=None)
        judge.next_submission()  # the first submission: the setup's globals are remembered
        learner.cells["answer cell a"] = "def a(): ..."
        learner.broken["answer cell a"] = ""
        shell.user_ns.update(results=[1.0], CHECK_TIMEOUT=0)  # bound and rebound by the first one's checks
        del shell.user_ns["learner"]
        judge.next_submission()
        assert learner.cells == {} and learner.broken == {}
        assert shell.user_ns == {"learner": None, "CHECK_TIMEOUT": 15, "_i3": "history"}
    finally:
        judge._state.clear()
        judge._state.update(saved)


def test_a_class_is_split_into_judge_runs_that_keep_every_job_busy():
    sys.path.insert(0, str(REPO / "scripts"))
    from course_lib.grading import grader as grade

    reference = grade.load_reference(FIXTURES / COLLECTIVES)
    assert grade.batch_split(reference) is not None
    merged, places, notes = grade.merge_many(reference, [CORRECT, {}])
    markers = [c for c in merged.cells if c.source == grade.NEXT_SUBMISSION_CELL]
    assert len(markers) == 2 and len({c.id for c in merged.cells}) == len(merged.cells)
    first, second = places
    check = reference.checks[0].cell_index
    assert first[check] < second[check]  # each submission has its own copy of every check
    assert notes[0] == [] and len(notes[1]) == 3  # the second left every answer cell out
    pending = {COLLECTIVES: list(range(20)), BASICS: list(range(3))}
    references = {COLLECTIVES: reference, BASICS: grade.load_reference(FIXTURES / BASICS)}
    tasks = grade.plan_batches(pending, references, jobs=2, max_batch=8)
    sizes = {name: sorted(len(batch) for n, batch in tasks if n == name) for name in pending}
    assert sizes == {COLLECTIVES: [6, 7, 7], BASICS: [3]}
    assert sorted(x for name, batch in tasks if name == COLLECTIVES for x in batch) == list(range(20))
    assert all(len(batch) == 1 for _, batch in grade.plan_batches(pending, references, jobs=2, max_batch=1))


def test_a_sandbox_that_cannot_start_leaves_its_submission_not_graded_and_the_others_scored():
    # The grader's cell before each submission ends the last sandbox and starts the next one's: no
    # student's code runs in it. When it fails, that submission is "not graded" (not given 0), the
    # batch's setup is not blamed, and the submissions around it are scored as usual.

    from course_lib.grading import grader as grade

    reference = grade.load_reference(FIXTURES / COLLECTIVES)
    merged, places, _ = grade.merge_many(reference, [CORRECT, CORRECT, CORRECT])
    markers = [p[grade.NEXT_MARKER] for p in places]
    assert [merged.cells[i].source for i in range(len(merged.cells)) if merged.cells[i].cell_type == "code"
            and merged.cells[i].execution_count - 1 in markers] == [grade.NEXT_SUBMISSION_CELL] * 3
    code_cells = sum(c.cell_type == "code" for c in merged.cells)
    outcomes = {n: grade.CellOutcome("passed") for n in range(code_cells)}
    outcomes[markers[1]] = grade.CellOutcome("failed", "RuntimeError")
    records = {n: {"ename": None} for n in range(code_cells)}  # the judge's record: each ended without an error
    records[markers[1]] = {"ename": "RuntimeError", "evalue": "the sandbox's first process is not in its cgroups"}
    run = grade.RunResult(outcomes, records, {})
    options = SimpleNamespace(cell_timeout=60, setup_timeout=600)
    assert grade.grader_setup_failure(run, places[0], reference, options) is None
    assert grade.submission_start_failure(run, places[0], options) is None
    assert grade.submission_start_failure(run, places[2], options) is None
    why = grade.submission_start_failure(run, places[1], options)
    assert why == (f"the grader's cell that starts this submission's sandbox (code cell {markers[1]}) raised "
                   "RuntimeError: the sandbox's first process is not in its cgroups"), why


def test_a_setup_that_fails_blames_the_grader_not_the_student(tmp_path):
    # The reference's setup cell (the course's code, none of the student's) can outlast even
    # --setup-timeout on a very busy machine: every check would then fail with a NameError that says
    # nothing about the answers. The feedback must say the grader failed, and grade.py must warn.
    solution = read_notebook(FIXTURES / BASICS)
    setup = cell_with_id(solution, "setup")
    setup.source = "import time\ntime.sleep(60)  # a setup slower than the cell timeout\n" + setup.source
    (tmp_path / "solutions").mkdir()
    nbformat.write(solution, tmp_path / "solutions" / BASICS)
    (tmp_path / "exercises").mkdir()
    nbformat.write(exercise(BASICS), tmp_path / "exercises" / BASICS)
    write(tmp_path / "class", "alice", BASICS, answered(BASICS, CORRECT))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path / "class"),
                           "--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "exercises"),
                           "--cell-timeout", "4", "--setup-timeout", "4", "--jobs", "1"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (tmp_path / "class" / "alice" / "feedback.txt").read_text()
    assert "not graded: the grader's own setup (code cell" in text, text
    assert "none of the student's code) did not finish within the setup timeout (4 s)" in text, text
    assert "NameError" not in text and "FAILED" not in text, text
    assert f"warning: {BASICS}: the grader's own setup" in proc.stderr, proc.stderr


def test_the_graders_own_cells_run_under_the_setup_timeout_and_the_students_under_the_cell_timeout(tmp_path):
    # A class graded with many jobs on few cores can slow the setup (torch imported, data loaded)
    # past a student's --cell-timeout; it must not leave the batch "not graded". The plugin lends
    # the cells the grader names its own limit; every other cell keeps nbval's.
    from course_lib.grading import running

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in
                      ["import time\ntime.sleep(4)  # the grader's: slower than the cell timeout",
                       "import time\ntime.sleep(4)  # a student's, as slow",
                       "print('after')"]]
    nbformat.write(notebook, tmp_path / "own.ipynb")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")

    limits = SimpleNamespace(cell_timeout=1, setup_timeout=120)
    command = running.pytest_command(tmp_path, tmp_path / "own.ipynb", limits, own_cells=[0])  # the grader's own
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTHONPATH=str(REPO))
    finished, lines = running.run_pytest(command, tmp_path, env, tmp_path / "log", time_limit=240)
    outcomes = running.read_verdicts(lines)
    log = (tmp_path / "log").read_text()
    assert finished and sorted(outcomes) == [0, 1, 2], log
    assert outcomes[0].status == "passed", log
    assert outcomes[1].status == "failed" and "Timeout of 1 seconds" in outcomes[1].message, log
    assert outcomes[2].status == "passed", log


def test_a_check_cell_cut_off_by_the_runs_time_limit_has_not_passed():
    # The run is killed for time while check cell 2 runs: only its setup was reported. It earns nothing.
    from course_lib.grading import running

    def report(cell, when, outcome="passed"):
        return json.dumps({"name": f"Cell {cell}", "when": when, "outcome": outcome, "xfail": False, "message": ""})

    lines = [report(0, "setup"), report(0, "call"), report(0, "teardown"),
             report(1, "setup"), report(1, "call", "failed"), report(1, "teardown"),
             report(2, "setup")]
    outcomes = running.read_verdicts(lines)
    assert [outcomes[n].status for n in (0, 1, 2)] == ["passed", "failed", "missing"]


def test_a_solution_whose_checks_would_run_answers_in_the_judge_is_refused(tmp_path):
    solution = read_notebook(FIXTURES / BASICS)
    for cell in solution.cells:
        cell.source = "\n".join(line for line in cell.source.splitlines() if "Learner(" not in line)
    (tmp_path / "solutions").mkdir()
    nbformat.write(solution, tmp_path / "solutions" / BASICS)
    (tmp_path / "exercises").mkdir()
    nbformat.write(exercise(BASICS), tmp_path / "exercises" / BASICS)
    (tmp_path / "class" / "alice").mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path / "class"),
                           "--solutions", str(tmp_path / "solutions"), "--exercises", str(tmp_path / "exercises")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "creates a course_lib.grading.Learner" in proc.stderr, proc.stderr


def test_every_cell_that_crashes_the_judge_is_set_aside_and_the_rest_of_the_batch_runs(tmp_path, monkeypatch):
    """A judge run ends where a cell kills or hangs its kernel; the grader replaces that cell and runs the
    batch again, as often as it takes: five such cells in one batch still leave every other cell graded."""

    from course_lib.grading import grader, running

    crashing = {1, 3, 4, 6, 7}  # more than any fixed number of reruns would allow
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"cell_{n} = {n}") for n in range(9)])
    runs = []

    def judge_run(command, cwd, env, log_path, time_limit):
        # What a judge does with the notebook it was given: it stops at the first crashing cell not yet replaced.
        sources = [cell.source for cell in nbformat.read(cwd / "graded.ipynb", as_version=4).cells]
        outcomes, records = {}, {}
        for number, source in enumerate(sources):
            if number in crashing and not source.startswith("raise RuntimeError"):
                outcomes[number] = grader.CellOutcome("failed", "Timeout of 5 seconds")
                break  # no record: the kernel died here, and no later cell ran
            outcomes[number] = grader.CellOutcome("failed" if source.startswith("raise") else "passed")
            records[number] = {"ename": "RuntimeError" if source.startswith("raise") else None}
        runs.append(records)
        return True, [(outcomes, records)]

    monkeypatch.setattr(running, "run_pytest", judge_run)  # run_merged's module, where it looks them up
    monkeypatch.setattr(running, "read_verdicts", lambda lines: lines[0][0])
    monkeypatch.setattr(running, "read_records", lambda path, sources, secret: runs[-1])
    options = SimpleNamespace(cell_timeout=5, setup_timeout=5, secret="s", no_sandbox=False, run_id="t", jobs=1)
    result = grader.run_merged(notebook, tmp_path, options)
    assert sorted(result.replaced) == sorted(crashing)
    assert all(result.outcomes[n].status == "passed" for n in range(9) if n not in crashing)
    assert len(runs) == len(crashing) + 1


def test_an_interrupted_grading_stops_its_judges_and_leaves_nothing(tmp_path):
    """Ctrl-C while judges run: grade.py stops them, starts no other (a killed judge is not a crash to
    run again), waits for its batches to remove their work folders, writes nothing, and exits 130."""
    from test_nothing_left_behind import kept

    folder, exercises, temporary = tmp_path / "class", tmp_path / "exercises", Path(tempfile.mkdtemp())
    try:
        make_class_of_two(folder, exercises)
        proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "grade.py"), str(folder), "--solutions",
                                 str(FIXTURES), "--exercises", str(exercises), "--jobs", "2", "--max-batch", "1"],
                                env=dict(os.environ, TMPDIR=str(temporary)), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline, family = time.monotonic() + 120, []
        while not any("ipykernel" in " ".join(p.cmdline()) for p in family) and time.monotonic() < deadline:
            time.sleep(0.2)
            with contextlib.suppress(psutil.Error):
                family = psutil.Process(proc.pid).children(recursive=True)
        assert family, "no judge's kernel started within 120 s"
        time.sleep(1)                      # the judges at work
        family = [child.pid for child in psutil.Process(proc.pid).children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        reruns = set()        # a batch runs its notebook again (run1, ...) after its judge crashed: never here
        while proc.poll() is None:
            reruns |= {p.name for p in temporary.glob("*/run[1-9]*")}
            time.sleep(0.02)
        out, err = proc.communicate(timeout=120)
        assert not reruns, f"judges ran again after the interrupt: {sorted(reruns)}"
        assert proc.returncode == 130 and "interrupted: nothing written" in err, out + err
        assert not (folder / "grades.csv").exists() and not list(folder.glob("*/feedback.txt"))
        assert kept(temporary) == [], f"grade.py left {kept(temporary)} in its TMPDIR"
        assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def make_class_of_two(folder: Path, exercises: Path) -> None:
    exercises.mkdir()
    for name in (COLLECTIVES, BASICS):
        nbformat.write(exercise(name), exercises / name)
    for student in ("alice", "bob"):
        write(folder, student, COLLECTIVES, answered(COLLECTIVES, CORRECT))
        write(folder, student, BASICS, answered(BASICS, CORRECT))
