"""The grader survives any class folder: every name, notebook and file in it is input from strangers.

Each test below is a route by which a class folder once stopped grade.py, lost grades.csv for
everyone, wrote through a link, or let a student's name act on the instructor's spreadsheet or
terminal. Most call the grader's functions directly on a folder made in tmp_path; one grades a small
class end to end (scripts/grade.py) with several bad names and notebooks beside one honest student.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import grader, merging, reporting, scoring
from course_lib.grading.merging import read_submission
from course_lib.grading.reporting import print_table, report_progress, write_csv, write_feedback
from course_lib.grading.scoring import CheckResult, NotebookResult, prepare

from test_grading import BASICS, CORRECT, FIXTURES, REPO, answered, exercise, write

NAMES = [BASICS]
MAXIMA = {BASICS: 1}
NOT_UTF8 = os.fsdecode(b"b\xffob")  # a folder name whose bytes are not UTF-8, as Python reads it


def results(students: list[str], **fields) -> dict[tuple[str, str], NotebookResult]:
    return {(student, BASICS): NotebookResult(student, BASICS, 1, **fields) for student in students}


def make_folders(root: Path, students: list[str]) -> None:
    for student in students:
        (root / student).mkdir(parents=True)


def csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def strict_stdout(monkeypatch) -> io.BytesIO:
    """A stdout that refuses what a UTF-8 terminal cannot show (Python's default outside the C locale)."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", errors="strict"))
    return raw


# --------------------------------------------------------------------------
# Names and messages that are not UTF-8, or would break a line
# --------------------------------------------------------------------------
def test_a_file_name_that_is_not_utf8_is_named_in_the_feedback_with_its_byte_escaped(tmp_path):
    make_folders(tmp_path, ["alice"])
    (tmp_path / "alice" / os.fsdecode(b"notes-\xff.ipynb")).write_text("{}")
    write_feedback(tmp_path, ["alice"], NAMES, results(["alice"]))
    text = (tmp_path / "alice" / "feedback.txt").read_text(encoding="utf-8")
    assert "Not graded: notes-\\xff.ipynb (not one of the exercise notebooks)" in text, text
    assert sorted(os.listdir(tmp_path / "alice")) == sorted(["feedback.txt", os.fsdecode(b"notes-\xff.ipynb")])


def test_a_folder_name_that_is_not_utf8_gets_its_feedback_a_csv_row_and_a_table_row(tmp_path, monkeypatch):
    make_folders(tmp_path, ["alice", NOT_UTF8])
    table = results(["alice", NOT_UTF8])
    write_feedback(tmp_path, ["alice", NOT_UTF8], NAMES, table)
    write_csv(tmp_path / "grades.csv", ["alice", NOT_UTF8], NAMES, table, MAXIMA)
    raw = strict_stdout(monkeypatch)
    report_progress(table[NOT_UTF8, BASICS], no_sandbox=True)
    print_table(["alice", NOT_UTF8], NAMES, table, MAXIMA)
    sys.stdout.flush()
    assert "Feedback for b\\xffob:" in (tmp_path / NOT_UTF8 / "feedback.txt").read_text(encoding="utf-8")
    assert [row[0] for row in csv_rows(tmp_path / "grades.csv")] == ["student", "alice", "b\\xffob"]
    assert "b\\xffob" in raw.getvalue().decode("utf-8")


def test_a_lone_surrogate_in_a_message_is_written_visibly_and_never_stops_the_others(tmp_path, monkeypatch):
    # A learner's code raised an exception whose message is "\ud800"; scoring quotes it.
    make_folders(tmp_path, ["alice", "bob"])
    table = results(["alice", "bob"])
    check = merging.Check(3, "check_double", 1, "double \ud800")
    table["alice", BASICS].checks = [CheckResult(check, 0, "ValueError: \ud800")]
    table["alice", BASICS].notes = ["answer cell 'double' raised an error: \udfff"]
    table["bob", BASICS].problem = "could not be graded: the grader failed (\ud800)"
    raw = strict_stdout(monkeypatch)
    write_feedback(tmp_path, ["alice", "bob"], NAMES, table)
    write_csv(tmp_path / "grades.csv", ["alice", "bob"], NAMES, table, MAXIMA)
    for result in table.values():
        report_progress(result, no_sandbox=False)
    print_table(["alice", "bob"], NAMES, table, MAXIMA)
    sys.stdout.flush()
    alice = (tmp_path / "alice" / "feedback.txt").read_text(encoding="utf-8")
    assert "double \\ud800: FAILED" in alice and "ValueError: \\ud800" in alice and "error: \\udfff" in alice
    assert "the grader failed (\\ud800)" in (tmp_path / "bob" / "feedback.txt").read_text(encoding="utf-8")
    assert "bob/tiny_basics.ipynb: could not be graded: the grader failed (\\ud800)" in raw.getvalue().decode()


def test_names_that_would_break_a_line_or_drive_the_terminal_stay_on_their_own_line(tmp_path, capsys):
    students = ["eve\n(max)  1  1  100.0", "mallory\x1b[2J\r", "rtl\u202eevil"]
    make_folders(tmp_path, students)
    table = results(students)
    (tmp_path / students[0] / "a\nb.ipynb").write_text("{}")
    print_table(students, NAMES, table, MAXIMA)
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) == 2 + len(students), printed
    assert "eve\\n(max)" in printed and "mallory\\x1b[2J\\r" in printed and "rtl\\u202eevil" in printed
    assert "\x1b" not in printed and "\r" not in printed and "\u202e" not in printed
    write_feedback(tmp_path, students, NAMES, table)
    eve = (tmp_path / students[0] / "feedback.txt").read_text()
    assert "Feedback for eve\\n(max)  1  1  100.0:" in eve and "Not graded: a\\nb.ipynb" in eve, eve
    write_csv(tmp_path / "grades.csv", students, NAMES, table, MAXIMA)
    assert len(csv_rows(tmp_path / "grades.csv")) == 1 + len(students)


# --------------------------------------------------------------------------
# grades.csv: never through a link, never a formula, a folder in its way refused before grading
# --------------------------------------------------------------------------
def test_cells_a_spreadsheet_would_run_as_formulas_are_written_as_text(tmp_path):
    students = ['=HYPERLINK("http://x","click")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "alice"]
    write_csv(tmp_path / "grades.csv", students, NAMES, results(students), MAXIMA)
    rows = csv_rows(tmp_path / "grades.csv")
    assert [row[0] for row in rows[1:]] == ["'=HYPERLINK(\"http://x\",\"click\")", "'+1+1", "'-2+3", "'@SUM(A1)",
                                            "\\tx", "\\rx", "alice"]
    assert rows[0] == ["student", "tiny_basics", "total", "max", "percent", "grading"]
    assert rows[-1] == ["alice", "0", "0", "1", "0.0", "sandboxed"]  # numbers stay numbers
    assert reporting.csv_cell("\tx") == "\\tx" and reporting.csv_cell("-1") == "'-1"


def test_grades_csv_replaces_a_link_and_leaves_its_target_alone(tmp_path):
    target = tmp_path / "instructor_notes.txt"
    target.write_text("my notes\n")
    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "grades.csv").symlink_to(target)
    write_csv(tmp_path / "class" / "grades.csv", ["alice"], NAMES, results(["alice"]), MAXIMA)
    assert target.read_text() == "my notes\n"
    assert not (tmp_path / "class" / "grades.csv").is_symlink()
    assert csv_rows(tmp_path / "class" / "grades.csv")[1][0] == "alice"


def test_a_folder_named_grades_csv_is_refused_before_grading_and_named_with_the_fix(tmp_path, capsys):
    make_folders(tmp_path / "class", ["alice", "grades.csv"])
    (tmp_path / "class" / "alice" / BASICS).write_text("{}")
    started = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        grader.main([str(tmp_path / "class"), "--no-sandbox", "--solutions", str(FIXTURES)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and time.monotonic() - started < 10
    assert f"{tmp_path / 'class' / 'grades.csv'} is a folder" in err and "--csv" in err, err
    assert not (tmp_path / "class" / "alice" / "feedback.txt").exists()  # nothing graded


def test_a_csv_destination_that_cannot_be_written_is_refused_before_grading(tmp_path, capsys):
    make_folders(tmp_path / "class", ["alice"])
    with pytest.raises(SystemExit):
        grader.main([str(tmp_path / "class"), "--no-sandbox", "--csv", str(tmp_path / "nowhere" / "grades.csv")])
    assert f"{tmp_path / 'nowhere'}" in capsys.readouterr().err


def test_a_csv_destination_lost_during_grading_leaves_the_grades_in_a_file_beside_it(tmp_path, capsys):
    (tmp_path / "grades.csv").mkdir()  # made while the class was being graded
    written = grader.save_grades(tmp_path / "grades.csv", ["alice"], NAMES, results(["alice"]), MAXIMA, "r1")
    err = capsys.readouterr().err
    assert written == tmp_path / "grades-r1.csv" and csv_rows(written)[1][0] == "alice"
    assert f"{tmp_path / 'grades.csv'} is a folder" in err and str(written) in err, err


def test_failed_writes_leave_no_temporary_file_behind(tmp_path):
    (tmp_path / "grades.csv").mkdir()
    with pytest.raises(IsADirectoryError):
        reporting.replace_file(tmp_path / "grades.csv", "x")
    assert os.listdir(tmp_path) == ["grades.csv"]


# --------------------------------------------------------------------------
# Student folders and files that are not what they seem
# --------------------------------------------------------------------------
def test_feedback_txt_that_is_a_folder_gets_a_warning_naming_it_and_the_others_get_theirs(tmp_path, capsys):
    make_folders(tmp_path, ["alice", "bob"])
    (tmp_path / "alice" / "feedback.txt" / "inside").mkdir(parents=True)
    write_feedback(tmp_path, ["alice", "bob"], NAMES, results(["alice", "bob"]))
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'alice' / 'feedback.txt'} is a folder" in err and "rename" in err, err
    assert (tmp_path / "alice" / "feedback.txt" / "inside").is_dir()  # nothing of alice's removed
    assert "Feedback for bob" in (tmp_path / "bob" / "feedback.txt").read_text()


def test_a_notebook_that_is_a_folder_is_not_graded_and_says_why(tmp_path):
    (tmp_path / "alice" / BASICS).mkdir(parents=True)
    result, answers = prepare("alice", tmp_path / "alice" / BASICS, reference())
    assert answers is None and result.problem == f"could not be graded: {BASICS} is a folder, not a notebook: " \
                                                 "hand in the notebook file itself"


def test_an_enormous_number_of_other_files_is_summed_up_in_the_feedback(tmp_path):
    make_folders(tmp_path, ["alice"])
    for number in range(3000):
        (tmp_path / "alice" / f"copy{number:04}.ipynb").touch()
    write_feedback(tmp_path, ["alice"], NAMES, results(["alice"]))
    text = (tmp_path / "alice" / "feedback.txt").read_text()
    listed = [line for line in text.splitlines() if line.startswith("Not graded: copy")]
    assert len(listed) == reporting.LISTED_FILES and listed[0].startswith("Not graded: copy0000.ipynb")
    assert f"... and {3000 - reporting.LISTED_FILES} more files that are not exercise notebooks" in text


def run_as_nobody(function, *args):
    """function(*args) in a child process that cannot bypass file permissions (uid 65534 when root)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            outcome = ("ok", function(*args))
        except BaseException as exc:  # noqa: BLE001 - sent back to the test
            outcome = ("raised", repr(exc))
        with os.fdopen(write_end, "wb") as out:
            out.write(pickle.dumps(outcome))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as back:
        data = back.read()
    os.waitpid(child, 0)
    return pickle.loads(data)


def grade_an_unreadable_folder(root: str) -> tuple:
    result, answers = prepare("bob", Path(root) / "bob" / BASICS, reference())
    write_feedback(Path(root), ["alice", "bob"], NAMES, results(["alice", "bob"]))
    return result.problem, answers, (Path(root) / "alice" / "feedback.txt").exists()


def test_a_student_folder_that_cannot_be_read_is_not_graded_and_the_others_are():
    reference()  # read before the rights to read it are dropped
    root = Path(tempfile.mkdtemp(prefix="grading-unreadable-"))  # in /tmp: uid 65534 can reach it
    try:
        make_folders(root, ["alice", "bob"])
        (root / "bob" / BASICS).write_text("{}")
        for folder in (root, root / "alice"):
            folder.chmod(0o777)
        (root / "bob").chmod(0o000)
        outcome = run_as_nobody(grade_an_unreadable_folder, str(root))
    finally:
        (root / "bob").chmod(0o755)
        shutil.rmtree(root)
    assert outcome == ("ok", (f"could not be graded: {BASICS} cannot be reached in your folder (Permission denied)",
                              None, True)), outcome


def folders_of_an_unsearchable_class(root: str) -> list[str]:
    return grader.student_folders(grader.argument_parser(), Path(root))


def test_entries_of_the_class_folder_that_cannot_be_examined_are_named_in_a_warning(capfd):
    root = Path(tempfile.mkdtemp(prefix="grading-unsearchable-"))  # in /tmp: uid 65534 can reach it
    try:
        make_folders(root, ["alice"])
        root.chmod(0o744)  # its names can be listed, but not looked at
        outcome = run_as_nobody(folders_of_an_unsearchable_class, str(root))
    finally:
        root.chmod(0o755)
        shutil.rmtree(root)
    assert outcome == ("ok", [])
    assert f"warning: {root / 'alice'} cannot be examined (Permission denied): not graded" in capfd.readouterr().err


def test_any_other_error_reading_one_notebook_leaves_only_that_notebook_not_graded(tmp_path, monkeypatch):
    def broken_disk(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(scoring, "read_submission", broken_disk)
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / BASICS).write_text("{}")
    result, answers = prepare("alice", tmp_path / "alice" / BASICS, reference())
    assert answers is None and result.problem == ("could not be graded: the grader failed on this notebook "
                                                  "(OSError: [Errno 5] Input/output error); ask your instructor")


# --------------------------------------------------------------------------
# Notebooks built to stop the reader: too deep, too large, too many objects
# --------------------------------------------------------------------------
@functools.cache
def reference() -> merging.Reference:
    return merging.load_reference(FIXTURES / BASICS)


def not_graded_because(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "alice" / BASICS
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result, answers = prepare("alice", path, reference())
    assert answers is None
    return result.problem


def test_a_notebook_nested_100000_deep_is_not_graded_and_says_why(tmp_path):
    problem = not_graded_because(tmp_path, '{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert problem == f"could not be graded: the file is not a notebook (its JSON is nested more than " \
                      f"{merging.NOTEBOOK_DEPTH} levels deep)"


def test_a_notebook_nested_deeper_than_any_notebook_but_within_pythons_stack_is_refused(tmp_path):
    deep = {"cells": [], "metadata": {"x": json.loads("[" * 500 + "]" * 500)}}
    assert "nested more than" in not_graded_because(tmp_path, json.dumps(deep))


def test_a_notebook_of_millions_of_objects_is_refused_before_nbformat_reads_it(tmp_path):
    # 60 MB of empty cells: nbformat took 100 s and 12 GB of memory to refuse it.
    cells = ",".join(["{}"] * 3_000_000)
    started = time.monotonic()
    problem = not_graded_because(tmp_path, '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": ['
                                           + cells + "]}")
    assert f"more than {merging.NOTEBOOK_CONTAINERS:,} objects and lists" in problem, problem
    assert time.monotonic() - started < 20


def test_a_notebook_larger_than_the_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "alice" / BASICS
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.truncate(merging.SUBMISSION_BYTES + 1)  # sparse: nothing written
    result, _ = prepare("alice", path, reference())
    assert result.problem == "could not be graded: the file is 64 MiB, more than a notebook's 64 MiB: clear its " \
                             "outputs (Edit > Clear Outputs of All Cells)"


def test_a_number_of_thousands_of_digits_is_not_graded_and_says_why(tmp_path):
    problem = not_graded_because(tmp_path, '{"cells": [], "metadata": {"n": ' + "9" * 5000 + "}}")
    assert problem.startswith("could not be graded: the file is not a notebook (Exceeds the limit"), problem


def test_running_out_of_memory_while_parsing_is_one_notebook_not_graded(tmp_path, monkeypatch):
    def no_memory(*args, **kwargs):
        raise MemoryError

    reference()  # read before json fails
    monkeypatch.setattr(merging.json, "loads", no_memory)
    assert "took more memory than the grader has" in not_graded_because(tmp_path, '{"cells": []}')


def test_read_submission_still_reads_an_honest_notebook(tmp_path):
    write(tmp_path, "alice", BASICS, answered(BASICS, CORRECT))
    notebook = read_submission(tmp_path / "alice" / BASICS)
    assert any(cell.source == CORRECT["double"] for cell in notebook.cells)


# --------------------------------------------------------------------------
# The command line: relative paths, and names for the work folders
# --------------------------------------------------------------------------
def test_relative_paths_in_every_option_are_made_absolute_and_links_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "class").mkdir()
    (tmp_path / "real.csv").touch()
    (tmp_path / "link.csv").symlink_to(tmp_path / "real.csv")
    parser = grader.argument_parser()
    options = grader.parse_options(parser, ["class", "--keep-work", "work", "--csv", "link.csv", "--solutions",
                                            "sol", "--exercises", "../ex"])
    assert options.submissions == tmp_path / "class" and options.keep_work == tmp_path / "work"
    assert options.solutions == tmp_path / "sol" and options.exercises == tmp_path / ".." / "ex"
    assert options.csv == tmp_path / "link.csv"  # the link itself, replaced when written: never its target
    assert grader.parse_options(parser, ["class"]).csv == tmp_path / "class" / "grades.csv"


@pytest.mark.parametrize("student", ["l" * 255, "a\nb", NOT_UTF8, "-p evil", "../up"])
def test_any_student_name_makes_a_work_folder(tmp_path, student):
    prefix = grader.work_folder_prefix(student, "01_collectives.ipynb")
    folder = Path(os.path.join(tmp_path, prefix + "XXXXXXXX"))
    folder.mkdir()
    assert folder.parent == tmp_path


def test_a_class_folder_that_cannot_be_read_is_a_usage_error(tmp_path, capsys):
    parser = grader.argument_parser()
    with pytest.raises(SystemExit):
        grader.student_folders(parser, tmp_path / "missing")
    assert f"{tmp_path / 'missing'} cannot be read" in capsys.readouterr().err


# --------------------------------------------------------------------------
# One class, end to end: bad names and notebooks beside an honest student
# --------------------------------------------------------------------------
LONG_NAME = "Lo" + "n" * 240 + "g"  # first in its batch (capitals sort first): names the judge's work folder
FORMULA = '=HYPERLINK("x","click")'


def make_hostile_class(folder: Path) -> None:
    write(folder, "alice", BASICS, answered(BASICS, CORRECT))
    (folder / "alice" / os.fsdecode(b"notes-\xff.ipynb")).write_text("{}")
    write(folder, LONG_NAME, BASICS, answered(BASICS, CORRECT))
    write(folder, FORMULA, BASICS, exercise(BASICS))
    (folder / NOT_UTF8).mkdir()
    (folder / NOT_UTF8 / BASICS).write_text('{"cells": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (folder / "eve\nfake row").mkdir()
    (folder / "eve\nfake row" / BASICS).mkdir()  # a notebook that is a folder
    write(folder, "feedback_folder", BASICS, exercise(BASICS))
    (folder / "feedback_folder" / "feedback.txt").mkdir()


def test_a_hostile_class_is_graded_and_the_honest_students_get_every_point(tmp_path):
    make_hostile_class(tmp_path / "class")
    (tmp_path / "exercises").mkdir()
    nbformat.write(exercise(BASICS), tmp_path / "exercises" / BASICS)
    (tmp_path / "mine.txt").write_text("the instructor's\n")
    (tmp_path / "class" / "grades.csv").symlink_to(tmp_path / "mine.txt")
    env = dict(os.environ, PYTHONIOENCODING="utf-8")  # a strict UTF-8 stdout, as on a terminal
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), "class", "--solutions",
                           os.path.relpath(FIXTURES, tmp_path), "--exercises", "exercises", "--keep-work", "work",
                           "--no-sandbox", "--jobs", "2", "--cell-timeout", "60"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    print(proc.stdout, proc.stderr, f"graded in {time.monotonic() - started:.1f} s", sep="\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    rows = {row[0]: row[1:] for row in csv_rows(tmp_path / "class" / "grades.csv")}
    assert rows.pop("student") == ["tiny_basics", "total", "max", "percent", "grading"]
    assert rows == {
        "alice": ["1", "1", "1", "100.0", "not sandboxed"],
        LONG_NAME: ["1", "1", "1", "100.0", "not sandboxed"],
        "'" + FORMULA: ["0", "0", "1", "0.0", "not sandboxed"],
        "b\\xffob": ["0", "0", "1", "0.0", "not sandboxed"],
        "eve\\nfake row": ["0", "0", "1", "0.0", "not sandboxed"],
        "feedback_folder": ["0", "0", "1", "0.0", "not sandboxed"],
    }
    assert (tmp_path / "mine.txt").read_text() == "the instructor's\n"  # the link was replaced, not followed

    def feedback(student: str) -> str:
        return (tmp_path / "class" / student / "feedback.txt").read_text(encoding="utf-8")

    assert "1 of 1 points" in feedback("alice") and "Not graded: notes-\\xff.ipynb" in feedback("alice")
    assert "nested more than" in feedback(NOT_UTF8)
    assert f"{BASICS} is a folder, not a notebook" in feedback("eve\nfake row")
    assert f"{tmp_path / 'class' / 'feedback_folder' / 'feedback.txt'} is a folder" in proc.stderr
    assert any(name.startswith("Lonnnn") for name in os.listdir(tmp_path / "work"))  # --keep-work, relative
    table = proc.stdout[proc.stdout.index("\nstudent"):].strip().split("\n\n")[0].splitlines()
    assert len(table) == 2 + len(rows), table  # a newline in a name adds no row


def test_a_check_title_written_over_two_lines_is_read_whole():
    # Chapter 08's exercise 4 writes its title as two string literals; the report showed it cut at the first.
    from course_lib.grading.merging import check_label

    assert check_label('with checking("exercise 4: two meshes; "\n              "only the shard crosses"):\n    pass\n') \
        == "exercise 4: two meshes; only the shard crosses"
    assert check_label("with checking('one line'):\n    pass\n") == "one line"
    assert check_label("x = 1\n") is None
