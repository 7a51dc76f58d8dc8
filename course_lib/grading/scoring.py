"""Scoring: each check's points and message from a run's verdicts and records (grading, step 3).

A check cell earns its points when its pass is proven (``why_not_passed``: nbval saw it pass and the
judge's sealed record says it ended without an error). Its message is the exception's type
and message (a CheckFailed explains itself), never a traceback or a cell's source, with any line
of a hidden test removed. When one of the grader's own cells failed, no check is scored: the
submission is "not graded", never given 0 for the grader's fault.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .merging import NEXT_MARKER, Check, Reference, read_submission, student_answers
from .running import ANSI, CellOutcome, RunResult

MESSAGE_LINES = 25
CELL_FILE = re.compile(r"""[^\s"']*ipykernel_\d+[\\/]\d+\.py""")


@dataclass
class CheckResult:
    check: Check
    earned: float
    message: str  # "passed" or why not


@dataclass
class NotebookResult:
    student: str
    name: str
    max_points: float
    earned: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)
    problem: str | None = None  # why nothing could be graded
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sandboxed: bool = True


def prepare(student: str, path: Path, reference: Reference) -> tuple[NotebookResult, dict[str, str] | None]:
    """The student's result so far, and their answers; None when there is nothing to run."""
    result = NotebookResult(student, reference.name, reference.max_points)
    try:
        os.lstat(path)  # a link, even a broken one, is there: it is reported as a link
    except FileNotFoundError:
        result.problem = f"missing: no {reference.name} in your submission"
        return result, None
    except OSError as exc:  # a folder that cannot be searched (chmod 000), or that is no longer a folder
        result.problem = f"could not be graded: {reference.name} cannot be reached in your folder ({exc.strerror})"
        return result, None
    try:
        return result, student_answers(read_submission(path))
    except ValueError as exc:
        result.problem = f"could not be graded: {exc}"
    except Exception as exc:  # noqa: BLE001 - one notebook must never stop the class's grading
        result.problem = (f"could not be graded: the grader failed on this notebook ({type(exc).__name__}: {exc}); "
                          "ask your instructor")
    return result, None


def clean_message(text: str, hidden_lines: set[str]) -> str:
    """An exception message fit for a student: no colours, no hidden-test lines, not too long."""
    text = CELL_FILE.sub("<cell>", ANSI.sub("", text))
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip() not in hidden_lines]
    if len(lines) > MESSAGE_LINES:
        lines = lines[:MESSAGE_LINES] + [f"... ({len(lines) - MESSAGE_LINES} more lines)"]
    return "\n".join(lines)


NO_REPORT = ("this check did not report back: how it ended never reached the grader's record, so it earns "
             "nothing (if you think your answer is right, ask your instructor to grade it again)")


def why_not_passed(run: RunResult, number: int) -> str | None:
    """The one rule that gives a cell its points: None when its pass is proven, else what is missing.

    Proven means three things at once: nbval's verdict is "passed", the cell is the one that was
    written (not replaced after it hung the judge), and the judge's sealed record says it ended
    without an error (course_lib.grading.proof). An error the kernel could not send to nbval, a
    kernel that stopped answering or a record that never came fails here."""
    if number in run.replaced:
        return "replaced"
    if run.outcomes.get(number, CellOutcome("missing")).status != "passed":
        return "not passed"
    record = run.records.get(number)
    if record is None:
        return "no record"
    if record.get("ename") is not None:
        return "an error"
    return None


def describe_failure(number: int, run: RunResult, cell_timeout: float, hidden: set[str]) -> str:
    if number in run.replaced:
        return run.replaced[number]
    outcome = run.outcomes.get(number, CellOutcome("missing"))
    record = run.records.get(number)
    if outcome.status == "failed" and "Timeout of" in outcome.message:
        return (f"this cell ran longer than {cell_timeout:g} s and was stopped "
                "(an infinite loop, or a collective some rank never joins?)")
    if record and record.get("ename"):
        ename, evalue = record["ename"], record.get("evalue") or ""
        text = evalue if ename == "CheckFailed" else f"{ename}: {evalue}".rstrip(": ")
        return clean_message(text, hidden)
    if outcome.status == "passed":  # nbval saw no error, and the judge never said so either
        return NO_REPORT
    if outcome.status == "skipped":
        return "this check was skipped"
    if run.problem:
        return run.problem
    return "this check did not run (an earlier cell stopped the notebook)"


def score(result: NotebookResult, run: RunResult, numbers: dict[int, int], reference: Reference, options) -> None:
    """Fill in one submission's checks and notes from the run (numbers: reference cell -> nbval's cell number)."""
    for check in reference.checks:
        number = numbers[check.cell_index]
        if why_not_passed(run, number) is None:
            result.checks.append(CheckResult(check, check.points, "passed"))
        else:
            message = describe_failure(number, run, options.cell_timeout, reference.hidden_lines)
            message = message.removeprefix(f"FAILED {check.label}: ")  # the label is shown already
            result.checks.append(CheckResult(check, 0, message))
    for grade_id, index in reference.answer_ids.items():
        number = numbers.get(index)
        record = run.records.get(number) if number is not None else None
        if number in run.replaced:
            result.notes.append(f"answer cell {grade_id!r}: {run.replaced[number]}")
        elif record and record.get("ename"):
            message = describe_failure(number, run, options.cell_timeout, reference.hidden_lines)
            result.notes.append(f"answer cell {grade_id!r} raised an error: {message}")
    if run.problem:
        result.notes.append(run.problem)
    result.earned = sum(check.earned for check in result.checks)


# --------------------------------------------------------------------------
# The grader's own cells: when one failed, the submissions are not graded
# --------------------------------------------------------------------------
def setup_cells(numbers: dict[int, int], reference: Reference) -> list[int]:
    """The merged run's code cells of the grader's setup: the recorder (code cell 0) and the
    reference's cells before its first answer or check cell, which hold no student's code."""
    first_student_cell = min([*reference.answer_ids.values(), *(check.cell_index for check in reference.checks)])
    return [0] + sorted(number for index, number in numbers.items() if 0 <= index < first_student_cell)


def grader_own_cells(places: list[dict[int, int]], reference: Reference) -> list[int]:
    """Every code cell of a batch's run that holds none of a student's code: the setup (run once,
    with the first submission), and the cell before each submission that starts its sandbox."""
    starts = [numbers[NEXT_MARKER] for numbers in places if NEXT_MARKER in numbers]
    return sorted({*setup_cells(places[0], reference), *starts})


def grader_setup_failure(run: RunResult, numbers: dict[int, int], reference: Reference, options) -> str | None:
    """Why the grader's own setup cells failed, or None (a setup that outlasted --setup-timeout on a
    busy machine, say). Then no check says anything about the student's answers."""
    for number in setup_cells(numbers, reference):
        why = grader_cell_failure(run, number, options)
        if why:
            return f"the grader's own setup (code cell {number}, none of the student's code) {why}"
    return None


def submission_start_failure(run: RunResult, numbers: dict[int, int], options) -> str | None:
    """Why the grader's cell before this submission failed (it ends the last submission's sandbox and
    starts this one's; none of this student's code runs in it), or None."""
    number = numbers.get(NEXT_MARKER)
    why = None if number is None else grader_cell_failure(run, number, options)
    return why and f"the grader's cell that starts this submission's sandbox (code cell {number}) {why}"


def grader_cell_failure(run: RunResult, number: int, options) -> str | None:
    """How one of the grader's own cells failed, or None when it passed."""
    why = why_not_passed(run, number)
    if why is None:
        return None
    outcome = run.outcomes.get(number, CellOutcome("missing"))
    if "Timeout of" in outcome.message:
        return f"did not finish within the setup timeout ({options.setup_timeout:g} s)"
    if number in run.replaced:  # nbval cannot tell a kernel that died in the cell from one that hung past it
        return (f"did not finish: the grader's kernel died in it, or it ran past the setup timeout "
                f"({options.setup_timeout:g} s) and could not be interrupted")
    if run.records.get(number, {}).get("ename"):
        record = run.records[number]
        return f"raised {record['ename']}: {record.get('evalue') or ''}".rstrip(": ")
    if why == "no record":
        return "did not report back (no sealed record of how it ended)"
    return run.problem or "did not run"


def not_graded(result: NotebookResult, problem: str) -> None:
    """The grader's fault, not the student's: no check scored, and the feedback says why."""
    result.problem = problem
    result.checks, result.earned = [], 0.0
