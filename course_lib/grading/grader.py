"""Grade a class's exercise notebooks: a score table, grades.csv and one feedback file per student.

The grader's command line (introduced with chapter 01's exercises), beside the judge, the sandbox
and the verdicts plugin it runs. Usage (``course-grade`` once the course is installed, or
``python scripts/grade.py``):
    course-grade SUBMISSIONS [--jobs N] [--cell-timeout S] [--solutions DIR] [--exercises DIR]

Layout: ``SUBMISSIONS/<student>/<name>.ipynb``, where ``<name>.ipynb`` is the file name of an
exercise notebook in exercises/. Writes ``SUBMISSIONS/grades.csv`` and
``SUBMISSIONS/<student>/feedback.txt``.

How one notebook is scored:

1. Merge. The reference is the solution notebook ``solutions/<name>.ipynb``. Each answer cell
   (nbgrader metadata ``solution: true``) gets the source of the student's cell with the same
   ``grade_id``; a deleted answer cell gets the exercise's stub. Every other cell, the check
   cells with their hidden tests included, comes from the reference: editing or deleting a
   check changes nothing, and cells the student added are not run.
2. Run. nbval runs the merged notebook top to bottom in a fresh kernel through pytest
   (``--nbval-lax``: only errors count; ``--nbval-cell-timeout``). That kernel is the judge
   (course_lib.grading.judge): the answer cells reach it as text and run only in fresh
   learner-side worker processes, which send back data only. Each cell's outcome comes back
   on a pipe only pytest holds (course_lib.grading.verdicts). A cell that runs past the
   timeout is interrupted and fails; the cells after it still run. If the kernel could not be
   interrupted (or crashed), that cell is replaced by one that raises and the notebook is run
   again, so a hang costs only the cell it hits. Every process a notebook started is stopped
   afterwards. One judge grades up to ``--max-batch`` submissions of an exercise in turn (its
   kernel never runs their code, so it stays clean): the setup runs once, then each
   submission's answers and checks, with a cell between two submissions that drops the
   previous one's answer cells and every global its checks bound (course_lib.grading.judge.
   next_submission). That saves a kernel start per submission.
3. Score. A check cell (``grade: true``) earns its ``points`` when it ran without an error.
   If one of the grader's own cells failed (the recorder, or the reference's cells before its
   first answer or check: a setup that outlasted the cell timeout on a busy machine, say), no
   check is scored: the feedback says the grader failed, and grade.py warns on stderr.
4. Feedback. For each check: passed, or the exception's type and message (a CheckFailed
   explains itself). Tracebacks and cell sources are never shown, and any line of a
   hidden test is removed from the messages.

Confinement. Every submission's code runs in a sandbox of its own (course_lib.grading.sandbox:
bubblewrap; its own user, processes, network and files; limits on memory and processes), apart
from the judge. grade.py refuses to grade when this machine cannot make one, and says what to
install. ``--no-sandbox`` grades unconfined (a quick check of one's own notebook): every line of
the table and of grades.csv then says "not sandboxed".
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil

from ..launcher import available_cpus
from .exercises import make_exercise, read_notebook, stale_files
from .sandbox import remove_leftovers, sandbox_problem

REPO = Path(__file__).resolve().parents[2]
FEEDBACK_FILE = "feedback.txt"
MESSAGE_LINES = 25

# Runs first in every graded notebook. The kernel becomes the judge (non-dumpable, its hidden
# seed read from a file that is then deleted), and records each cell's exception (type and
# message only) so the feedback can quote it without the traceback and its source lines.
RECORDER_CELL = '''\
# Added by the grader: this kernel is the judge; remember each cell's exception for the feedback.
def _course_grader_setup():
    import hashlib, json, os
    import course_lib.grading.judge
    course_lib.grading.judge.become_judge()
    path = os.environ.pop("COURSE_GRADER_RECORD", None)
    if not path:
        return
    def remember(result):
        error = result.error_before_exec or result.error_in_exec
        try:
            message = None if error is None else str(error)
        except Exception:
            message = "(the exception's message could not be read)"
        entry = {"cell": hashlib.sha1(result.info.raw_cell.encode("utf-8", "replace")).hexdigest(),
                 "ename": None if error is None else type(error).__name__, "evalue": message}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\\n")
    get_ipython().events.register("post_run_cell", remember)
_course_grader_setup()
del _course_grader_setup'''

# What an answer cell becomes in the merged notebook: its text goes to the learner side; the
# judge (the kernel nbval talks to) never executes it.
ANSWER_CELL = """\
# Added by the grader: your answer cell runs on the learner side, never in this kernel.
import course_lib.grading.judge as _course_judge
_course_judge.answer_cell({label}, {source})"""

# Between two submissions graded by one judge (see merge_many).
NEXT_SUBMISSION_CELL = """\
# Added by the grader: the next submission's answers and checks; nothing of the last one's stays.
import course_lib.grading.judge as _course_judge
_course_judge.next_submission()"""

# The key, in a submission's places (reference cell -> nbval's cell number), of the grader's
# next_submission cell before it: no reference cell has this index.
NEXT_MARKER = -1

NBVAL_MARKER = re.compile(r"^\s*#\s*(NBVAL_\w+|PYTEST_VALIDATE_IGNORE_OUTPUT)\s*$")
NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-raises-exception", "nbval-skip",
              "raises-exception", "pytest-validate-ignore-output"}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
CELL_FILE = re.compile(r"""[^\s"']*ipykernel_\d+[\\/]\d+\.py""")
CHECK_NAME = re.compile(r"""checking\(\s*(?P<q>["'])(?P<name>.+?)(?P=q)""")


# --------------------------------------------------------------------------
# The reference: what a notebook's checks are, and what a deleted answer becomes
# --------------------------------------------------------------------------
@dataclass
class Check:
    cell_index: int
    grade_id: str
    points: float
    label: str


@dataclass
class Reference:
    name: str  # file name, e.g. 01_collectives.ipynb
    notebook: nbformat.NotebookNode  # the solution notebook
    stubs: dict[int, str]  # answer cell index -> the exercise's stub source
    answer_ids: dict[str, int]  # grade_id -> answer cell index
    checks: list[Check]
    hidden_lines: set[str]

    @property
    def max_points(self) -> float:
        return sum(check.points for check in self.checks)


def nbgrader_meta(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def hidden_test_lines(source: str) -> set[str]:
    lines, inside = set(), False
    for line in source.splitlines():
        if "BEGIN HIDDEN TESTS" in line:
            inside = True
        elif "END HIDDEN TESTS" in line:
            inside = False
        elif inside and line.strip():
            lines.add(line.strip())
    return lines


def load_reference(solution_path: Path) -> Reference:
    solution = read_notebook(solution_path)
    exercise = make_exercise(solution)
    stubs, answer_ids, checks, hidden, seen = {}, {}, [], set(), set()
    for index, cell in enumerate(solution.cells):
        meta = nbgrader_meta(cell)
        grade_id = meta.get("grade_id")
        if grade_id is not None:
            if grade_id in seen:
                raise ValueError(f"{solution_path}: grade_id {grade_id!r} is used by two cells")
            seen.add(grade_id)
        if meta.get("solution"):
            if grade_id is None:
                raise ValueError(f"{solution_path}: answer cell {index} has no grade_id")
            stubs[index] = exercise.cells[index].source
            answer_ids[grade_id] = index
        elif meta.get("grade") and cell.cell_type == "code":
            match = CHECK_NAME.search(cell.source)
            label = match["name"] if match else grade_id
            checks.append(Check(index, grade_id, meta.get("points", 0) or 0, label))
            hidden |= hidden_test_lines(cell.source)
    judged = any("Learner(" in cell.source for cell in solution.cells
                 if cell.cell_type == "code" and not nbgrader_meta(cell).get("solution"))
    if not judged:  # its answers would have to run in the kernel that decides the verdicts
        raise ValueError(f"{solution_path}: no setup cell creates a course_lib.grading.Learner, so its checks would "
                         "run the answers in the judge's own kernel; create `learner = Learner(answers=(...))` in "
                         "the setup cell and call the answers through learner.launch / learner.call")
    return Reference(solution_path.name, solution, stubs, answer_ids, checks, hidden)


# --------------------------------------------------------------------------
# Merging a submission into the reference
# --------------------------------------------------------------------------
def without_nbval_markers(cell) -> None:
    """Graded and answer cells must pass only by running cleanly: no skip, no 'raises' markers."""
    cell.source = "\n".join(line for line in cell.source.split("\n") if not NBVAL_MARKER.match(line))
    tags = cell.metadata.get("tags")
    if isinstance(tags, list):
        cell.metadata["tags"] = [tag for tag in tags if tag not in NBVAL_TAGS]


def read_submission(path: Path) -> nbformat.NotebookNode:
    """The student's notebook, or ValueError saying why it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not a notebook (not UTF-8 text)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the file is not a notebook (not valid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")), list):
        raise ValueError("the file is not a Jupyter notebook (no list of cells)")
    try:
        with contextlib.redirect_stderr(None):
            return nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds
        raise ValueError(f"the notebook cannot be read ({type(exc).__name__}: {exc})") from None


def student_answers(submission: nbformat.NotebookNode) -> dict[str, str]:
    answers: dict[str, str] = {}
    for cell in submission.get("cells", []):
        try:
            grade_id = nbgrader_meta(cell).get("grade_id")
            source = cell.get("source", "")
            source = "".join(source) if isinstance(source, list) else str(source)
        except AttributeError:
            continue
        if isinstance(grade_id, str) and grade_id not in answers:
            answers[grade_id] = source
    return answers


def batch_split(reference: Reference) -> int | None:
    """Where the cells a judge runs once end and those it runs per submission begin, or None.

    The setup cell (the one creating the Learner) and the cells before it run once; the rest
    (answers, checks, their helpers) run again for each submission the judge grades in turn.
    None when an answer or check cell comes before the setup (one judge per submission then).
    """
    setup = next((index for index, cell in enumerate(reference.notebook.cells)
                  if cell.cell_type == "code" and "Learner(" in cell.source
                  and not nbgrader_meta(cell).get("solution")), None)
    per_submission = set(reference.answer_ids.values()) | {check.cell_index for check in reference.checks}
    if setup is None or any(index <= setup for index in per_submission):
        return None
    return setup + 1


def merge_many(reference: Reference, submissions: list[dict[str, str]]
               ) -> tuple[nbformat.NotebookNode, list[dict[int, int]], list[list[str]]]:
    """One notebook for nbval that grades several submissions in turn with one judge.

    Returns the notebook, for each submission the code cell number (as nbval counts them) of
    each reference cell, and each submission's notes. The setup runs once; then, per
    submission, a cell that makes the judge forget the previous one, and the reference's
    remaining cells with this submission's answers in its answer cells.
    """
    split = batch_split(reference)
    if split is None and len(submissions) > 1:
        raise ValueError(f"{reference.name} cannot grade several submissions with one judge")
    template = json.loads(json.dumps(reference.notebook))
    ref_cells = template["cells"]
    once = range(split or 0)
    per_submission = range(split or 0, len(ref_cells))
    answer_index = {index: grade_id for grade_id, index in reference.answer_ids.items()}
    graded_cells = {check.cell_index for check in reference.checks} | set(answer_index)

    def copy_of(index: int, tag: str):
        cell = nbformat.from_dict(json.loads(json.dumps(ref_cells[index])))
        if tag:
            cell["id"] = f"{tag}-{index}"  # cell ids must stay unique in the merged notebook
        return cell

    cells, places, all_notes = [], [], []
    recorder = nbformat.v4.new_code_cell(RECORDER_CELL)
    recorder.id = "course-grader-recorder"
    cells.append((recorder, None))
    for index in once:
        cells.append((copy_of(index, ""), ("once", index)))
    for number, answers in enumerate(submissions):
        notes = []
        tag = f"s{number}" if split is not None else ""
        if split is not None:
            marker = nbformat.v4.new_code_cell(NEXT_SUBMISSION_CELL)
            marker.id = f"course-grader-next-{number}"
            cells.append((marker, (number, NEXT_MARKER)))
        for index in per_submission:
            cell = copy_of(index, tag)
            grade_id = answer_index.get(index)
            if grade_id is not None:
                if grade_id in answers:
                    source = answers[grade_id]
                else:
                    source = reference.stubs[index]
                    notes.append(f"answer cell {grade_id!r} was not found in your notebook: graded as not answered")
                cell.source = ANSWER_CELL.format(label=json.dumps(f"answer cell {grade_id}"), source=json.dumps(source))
            if index in graded_cells:
                without_nbval_markers(cell)
            cells.append((cell, (number, index)))
        all_notes.append(notes)
    merged = nbformat.from_dict(dict(template, cells=[]))
    places: list[dict[int, int]] = [{} for _ in submissions]
    count = 0
    for cell, where in cells:
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count  # nbval treats a cell without a count as never run
            cell.outputs = []
            if where is not None:
                owner, index = where
                for number in (range(len(submissions)) if owner == "once" else [owner]):
                    places[number][index] = count - 1  # nbval numbers code cells from 0
        merged.cells.append(cell)
    return merged, places, all_notes


def merge(reference: Reference, answers: dict[str, str]) -> tuple[nbformat.NotebookNode, list[str]]:
    """The reference notebook with one student's answers in it, ready for nbval."""
    merged, _, notes = merge_many(reference, [answers])
    return merged, notes[0]


# --------------------------------------------------------------------------
# Running one merged notebook under nbval, with every process it starts accounted for
# --------------------------------------------------------------------------
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()


def kill_tree(proc: subprocess.Popen, known: dict[int, psutil.Process]) -> None:
    """Stop proc and every process it started (also those already re-parented)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            known.setdefault(child.pid, child)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in known.values():
        with contextlib.suppress(psutil.Error):
            if child.is_running():  # is_running also guards against a reused pid
                child.kill()
    with contextlib.suppress(Exception):
        proc.wait(10)
    psutil.wait_procs(list(known.values()), timeout=5)


def run_pytest(command: list[str], cwd: Path, env: dict, log_path: Path, time_limit: float) -> tuple[bool, list[str]]:
    """Run pytest; return (False if it ran past time_limit and was killed, the verdict lines).

    The verdicts come on a pipe whose write end only pytest holds (course_lib.grading.verdicts).
    """
    known: dict[int, psutil.Process] = {}
    read_end, write_end = os.pipe()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(os.fdopen(read_end, encoding="utf-8", errors="replace")),
                              daemon=True)
    reader.start()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=dict(env, COURSE_VERDICT_FD=str(write_end)), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                pass_fds=(write_end,))
    os.close(write_end)
    with _running_lock:
        _running.add(proc)
    finished = False
    try:
        deadline = time.monotonic() + time_limit
        while time.monotonic() < deadline:
            try:
                proc.wait(0.5)
                finished = True
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        known.setdefault(child.pid, child)
    finally:
        kill_tree(proc, known)  # after a normal exit this stops only what was left behind
        with _running_lock:
            _running.discard(proc)
    reader.join(10)
    return finished, list(lines)


@dataclass
class CellOutcome:
    status: str  # passed, failed, xfailed, skipped, missing
    message: str = ""
    seconds: float = 0.0


def read_verdicts(lines: list[str]) -> dict[int, CellOutcome]:
    """nbval's items are named 'Cell N', N counting code cells from 0 (from the verdicts plugin)."""
    outcomes: dict[int, CellOutcome] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            match = re.fullmatch(r"Cell (\d+)", str(entry.get("name", "")))
        except (json.JSONDecodeError, AttributeError):
            continue
        if not match:
            continue
        number = int(match[1])
        outcome = outcomes.setdefault(number, CellOutcome("passed"))
        message = ANSI.sub("", str(entry.get("message") or ""))
        if entry.get("when") == "teardown":
            continue
        if entry.get("outcome") == "failed":
            outcome.status, outcome.message = "failed", message
        elif entry.get("outcome") == "skipped":
            outcome.status = "xfailed" if entry.get("xfail") else "skipped"
    return outcomes


def read_records(path: Path, code_sources: list[str]) -> dict[int, dict]:
    """Match the recorder's entries, in run order, to code cells (by source hash)."""
    if not path.exists():
        return {}
    hashes = [hashlib.sha1(source.encode("utf-8", "replace")).hexdigest() for source in code_sources]
    records, position = {}, 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        for index in range(position, len(hashes)):
            if hashes[index] == entry.get("cell"):
                records[index] = entry
                position = index + 1
                break
    return records


@dataclass
class RunResult:
    outcomes: dict[int, CellOutcome]  # by code cell number
    records: dict[int, dict]  # by code cell number
    replaced: dict[int, str]  # code cell number -> why it was replaced
    problem: str | None = None


def run_merged(merged: nbformat.NotebookNode, workdir: Path, options) -> RunResult:
    code_cells = [cell for cell in merged.cells if cell.cell_type == "code"]
    replaced: dict[int, str] = {}
    time_limit = options.cell_timeout * (len(code_cells) + 1) + 120
    # Each rerun replaces one more cell that never finished, so one rerun per code cell is enough for
    # any number of them: however many cells crash the judge, every other cell of the batch still runs.
    last_attempt = len(code_cells)
    for attempt in range(last_attempt + 1):
        rundir = workdir / f"run{attempt}"
        rundir.mkdir()
        notebook = nbformat.from_dict(json.loads(json.dumps(merged)))
        cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
        for number, why in replaced.items():
            cells[number].source = f"raise RuntimeError({why!r})"
        nb_path = rundir / "graded.ipynb"
        nbformat.write(notebook, nb_path)
        (rundir / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
        seed_file = rundir / "seed"  # read and deleted by the judge as it starts
        seed_file.write_text(options.secret)
        seed_file.chmod(0o600)
        env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", COURSE_GRADER_RECORD=str(rundir / "records.jsonl"),
                   COURSE_GRADING="1", COURSE_GRADING_SEED_FILE=str(seed_file),
                   COURSE_GRADING_SANDBOX="0" if options.no_sandbox else "1", COURSE_GRADING_RUN=options.run_id,
                   COURSE_GRADER_CELL_TIMEOUT=str(options.cell_timeout),
                   OMP_NUM_THREADS=str(max(1, available_cpus() // options.jobs)), PYTHONDONTWRITEBYTECODE="1",
                   # the jobs' ranks share the cores: a waiting OpenMP thread sleeps instead of
                   # spinning on a core another job's rank needs (results do not change)
                   OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        command = [sys.executable, "-m", "pytest", "-p", "nbval.plugin", "-p", "course_lib.grading.verdicts",
                   "-c", str(rundir / "pytest.ini"), "--rootdir", str(rundir), "--nbval-lax", "--nbval-current-env",
                   f"--nbval-cell-timeout={options.cell_timeout}", "-q", str(nb_path)]
        in_time, verdict_lines = run_pytest(command, rundir, env, rundir / "pytest.log", time_limit)
        outcomes = read_verdicts(verdict_lines)
        records = read_records(rundir / "records.jsonl", [cell.source for cell in cells])
        if not in_time:
            return RunResult(outcomes, records, replaced, f"the notebook ran longer than {time_limit:g} s in all")
        if not outcomes:
            return RunResult(outcomes, records, replaced, "the notebook could not be run (the grader's "
                             "kernel did not start); ask your instructor")
        # The first cell that failed without ever finishing (no record): the kernel hung
        # past the interrupt or died there, and no later cell ran.
        stuck = next((n for n in range(len(cells)) if n not in records and n not in replaced
                      and outcomes.get(n, CellOutcome("missing")).status in ("failed", "xfailed", "missing")), None)
        later_lost = stuck is not None and any(
            n not in records and n not in replaced
            and outcomes.get(n, CellOutcome("missing")).status in ("failed", "xfailed", "missing")
            for n in range(stuck + 1, len(cells)))
        if stuck is None or not later_lost or attempt == last_attempt:
            return RunResult(outcomes, records, replaced)
        # nbval cannot tell these apart: both end in its cell timeout without a reply.
        replaced[stuck] = (f"this cell did not finish: it ran longer than {options.cell_timeout:g} s and could "
                           "not be interrupted (an infinite loop?), or it crashed the Python kernel")
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------
# Scoring and feedback
# --------------------------------------------------------------------------
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


def clean_message(text: str, hidden_lines: set[str]) -> str:
    """An exception message fit for a student: no colours, no hidden-test lines, not too long."""
    text = CELL_FILE.sub("<cell>", ANSI.sub("", text))
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip() not in hidden_lines]
    if len(lines) > MESSAGE_LINES:
        lines = lines[:MESSAGE_LINES] + [f"... ({len(lines) - MESSAGE_LINES} more lines)"]
    return "\n".join(lines)


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
    if outcome.status == "skipped":
        return "this check was skipped"
    if run.problem:
        return run.problem
    return "this check did not run (an earlier cell stopped the notebook)"


def prepare(student: str, path: Path, reference: Reference) -> tuple[NotebookResult, dict[str, str] | None]:
    """The student's result so far, and their answers; None when there is nothing to run."""
    result = NotebookResult(student, reference.name, reference.max_points)
    if not path.exists():
        result.problem = f"missing: no {reference.name} in your submission"
        return result, None
    try:
        submission = read_submission(path)
    except ValueError as exc:
        result.problem = f"could not be graded: {exc}"
        return result, None
    return result, student_answers(submission)


def score(result: NotebookResult, run: RunResult, numbers: dict[int, int], reference: Reference, options) -> None:
    """Fill in one submission's checks and notes from the run (numbers: reference cell -> nbval's cell number)."""
    for check in reference.checks:
        number = numbers[check.cell_index]
        outcome = run.outcomes.get(number, CellOutcome("missing"))
        if outcome.status == "passed" and number not in run.replaced:
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


def grader_setup_failure(run: RunResult, numbers: dict[int, int], reference: Reference, options) -> str | None:
    """Why the grader's own cells failed, or None: the recorder and the reference's cells before its
    first answer or check cell, which hold no student's code (a setup that timed out on a busy
    machine, say). Then no check says anything about the student's answers."""
    first_student_cell = min([*reference.answer_ids.values(), *(check.cell_index for check in reference.checks)])
    own = [0] + sorted(number for index, number in numbers.items() if 0 <= index < first_student_cell)
    for number in own:
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
    outcome = run.outcomes.get(number, CellOutcome("missing"))
    if outcome.status == "passed" and number not in run.replaced:
        return None
    if number in run.replaced or "Timeout of" in outcome.message:
        return f"did not finish within the cell timeout ({options.cell_timeout:g} s)"
    if run.records.get(number, {}).get("ename"):
        record = run.records[number]
        return f"raised {record['ename']}: {record.get('evalue') or ''}".rstrip(": ")
    return run.problem or "did not run"


def grade_batch(batch: list[tuple[NotebookResult, dict[str, str]]], reference: Reference, options) -> list[NotebookResult]:
    """Grade submissions of one exercise in turn, with one judge (one nbval run)."""
    started = time.monotonic()
    try:
        merged, places, notes = merge_many(reference, [answers for _, answers in batch])
        first = batch[0][0].student
        workdir = Path(tempfile.mkdtemp(prefix=f"{first}-{Path(reference.name).stem}-", dir=options.work_root))
        try:
            run = run_merged(merged, workdir, options)
        finally:
            if not options.keep_work:
                shutil.rmtree(workdir, ignore_errors=True)
        failure = grader_setup_failure(run, places[0], reference, options)
        if failure:  # the grader's fault, not the students': say so, and blame no answer for it
            print(f"warning: {reference.name}: {failure}; {len(batch)} submission(s) not graded "
                  "(grade them again; on a busy machine, with a larger --cell-timeout)", file=sys.stderr, flush=True)
        for (result, _), numbers, note in zip(batch, places, notes):
            result.notes = note
            own_failure = failure or submission_start_failure(run, numbers, options)
            if own_failure:  # the grader's fault: this submission is not graded, not given 0
                result.problem = f"not graded: {own_failure}; ask your instructor to grade it again"
                result.checks, result.earned = [], 0.0
                continue
            score(result, run, numbers, reference, options)
    except Exception as exc:  # noqa: BLE001 - one submission must never stop the class's grading
        for result, _ in batch:
            result.problem = f"the grader failed on this notebook ({type(exc).__name__}: {exc}); ask your instructor"
            result.checks, result.earned = [], 0.0
    finally:
        for result, _ in batch:
            result.seconds = time.monotonic() - started
    return [result for result, _ in batch]


def plan_batches(pending: dict[str, list], references: dict[str, Reference], jobs: int,
                 max_batch: int) -> list[tuple[str, list]]:
    """Group each exercise's submissions into judge runs: few enough to save the start-up of a
    kernel per submission, enough to keep every job busy; the largest run first."""
    total = sum(len(items) for items in pending.values())
    tasks = []
    for name, items in pending.items():
        if not items:
            continue
        if max_batch <= 1 or batch_split(references[name]) is None:
            tasks += [(name, [item]) for item in items]
            continue
        count = max(math.ceil(len(items) / max_batch), math.ceil(jobs * len(items) / total))
        count = min(len(items), count)
        tasks += [(name, items[k::count]) for k in range(count)]
    return sorted(tasks, key=lambda task: -len(task[1]))


def points(value: float) -> str:
    return f"{value:g}"


def percent(earned: float, possible: float) -> str:
    return f"{100.0 * earned / possible:.1f}" if possible else "0.0"


def indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def feedback_text(student: str, results: list[NotebookResult], ignored: list[str]) -> str:
    earned = sum(r.earned for r in results)
    possible = sum(r.max_points for r in results)
    lines = [f"Feedback for {student}: {points(earned)} of {points(possible)} points "
             f"({percent(earned, possible)}%)", ""]
    for r in results:
        lines.append(f"{r.name}: {points(r.earned)} of {points(r.max_points)} points")
        if r.problem:
            lines.append(f"  {r.problem}")
        for c in r.checks:
            head = f"  [{points(c.earned)}/{points(c.check.points)}] {c.check.label}: "
            if c.message == "passed":
                lines.append(head + "passed")
            else:
                lines.append(head + "FAILED")
                lines.append(indent(c.message, "      "))
        for note in r.notes:
            lines.append(indent("note: " + note, "  "))
        lines.append("")
    for name in ignored:
        lines.append(f"Not graded: {name} (not one of the exercise notebooks)")
    return "\n".join(lines).rstrip() + "\n"


def confinement(table: dict, student: str, names: list[str]) -> str:
    return "sandboxed" if all(table[student, n].sandboxed for n in names) else "not sandboxed"


def print_table(students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    columns = [Path(name).stem for name in names]
    header = ["student", *columns, "total", "percent", "grading"]
    total_max = sum(maxima.values())
    rows = [["(max)", *[points(maxima[n]) for n in names], points(total_max), "100.0", ""]]
    for student in students:
        earned = [table[student, n].earned for n in names]
        rows.append([student, *map(points, earned), points(sum(earned)), percent(sum(earned), total_max),
                     confinement(table, student, names)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


def write_csv(path: Path, students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    total_max = sum(maxima.values())
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *[Path(n).stem for n in names], "total", "max", "percent", "grading"])
        for student in students:
            earned = [table[student, n].earned for n in names]
            writer.writerow([student, *map(points, earned), points(sum(earned)), points(total_max),
                             percent(sum(earned), total_max), confinement(table, student, names)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", type=Path, help="folder with one sub-folder per student")
    parser.add_argument("--solutions", type=Path, default=REPO / "solutions", help="reference notebooks")
    parser.add_argument("--exercises", type=Path, default=REPO / "exercises",
                        help="the exercise notebooks handed out (their names are what is graded)")
    parser.add_argument("--jobs", "-j", type=int, default=available_cpus(),
                        help="notebooks graded at once (default: the number of CPU cores)")
    parser.add_argument("--max-batch", type=int, default=8,
                        help="submissions of one exercise graded in turn by one judge kernel (default 8; 1: a "
                             "kernel for each)")
    parser.add_argument("--cell-timeout", type=float, default=120,
                        help="seconds one cell may run before it is stopped and fails (default 120)")
    parser.add_argument("--csv", type=Path, default=None, help="where to write the table (default SUBMISSIONS/grades.csv)")
    parser.add_argument("--keep-work", type=Path, default=None,
                        help="keep the merged notebooks and pytest logs here (they contain hidden tests)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run the submissions' code unconfined (only to check your own notebook quickly): every "
                             "line of the table and of grades.csv then says 'not sandboxed'")
    options = parser.parse_args(argv)
    options.run_id = secrets.token_hex(4)
    options.jobs = max(1, options.jobs)
    options.max_batch = max(1, options.max_batch)
    options.secret = secrets.token_hex(16)  # this run's hidden cases: known to no submission

    if not options.submissions.is_dir():
        parser.error(f"{options.submissions} is not a folder")
    if not options.no_sandbox:
        problem = sandbox_problem()
        if problem:
            print(f"grade.py: cannot grade: {problem}", file=sys.stderr)
            return 2
    names = sorted(p.name for p in options.exercises.glob("*.ipynb"))
    if not names:
        parser.error(f"no exercise notebooks in {options.exercises} (run `make exercises`)")
    missing = [n for n in names if not (options.solutions / n).exists()]
    if missing:
        parser.error(f"no solution notebook in {options.solutions} for: {', '.join(missing)}")
    for problem in stale_files(options.solutions, options.exercises):
        print(f"warning: {problem}", file=sys.stderr)
    try:
        references = {name: load_reference(options.solutions / name) for name in names}
    except ValueError as exc:
        parser.error(str(exc))
    maxima = {name: references[name].max_points for name in names}
    students = sorted(p.name for p in options.submissions.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    if not students:
        parser.error(f"no student folders in {options.submissions}")

    if options.keep_work:
        options.keep_work.mkdir(parents=True, exist_ok=True)
        options.work_root = str(options.keep_work)
    else:
        options.work_root = None
    print(f"grading {len(students)} students x {len(names)} notebooks with {options.jobs} jobs "
          f"(cell timeout {options.cell_timeout:g} s, up to {options.max_batch} submissions per judge, "
          f"{'NOT SANDBOXED' if options.no_sandbox else 'each submission in a sandbox'})", flush=True)
    started = time.monotonic()
    table: dict[tuple[str, str], NotebookResult] = {}
    pending: dict[str, list] = {name: [] for name in names}

    def report(result: NotebookResult, shared: int = 1) -> None:
        result.sandboxed = not options.no_sandbox
        status = result.problem or f"{points(result.earned)}/{points(result.max_points)}"
        together = f", one judge for {shared} submissions" if shared > 1 else ""
        together += ", not sandboxed" if options.no_sandbox else ""
        print(f"  {result.student}/{result.name}: {status} ({result.seconds:.1f} s{together})", flush=True)

    for name in names:
        for student in students:
            result, answers = prepare(student, options.submissions / student / name, references[name])
            if answers is None:
                table[student, name] = result
                report(result)
            else:
                pending[name].append((result, answers))
    tasks = plan_batches(pending, references, options.jobs, options.max_batch)
    pool = ThreadPoolExecutor(max_workers=options.jobs)
    try:
        futures = [pool.submit(grade_batch, batch, references[name], options) for name, batch in tasks]
        for future in as_completed(futures):
            results = future.result()
            for result in results:
                table[result.student, result.name] = result
                report(result, len(results))
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        with _running_lock:
            for proc in list(_running):
                kill_tree(proc, {})
        remove_leftovers(options.run_id)
        print("interrupted: nothing written", file=sys.stderr)
        return 130
    pool.shutdown()
    remove_leftovers(options.run_id)  # the sandboxes of judges that were killed

    for student in students:
        folder = options.submissions / student
        ignored = sorted(p.name for p in folder.glob("*.ipynb") if p.name not in names)
        text = feedback_text(student, [table[student, n] for n in names], ignored)
        (folder / FEEDBACK_FILE).write_text(text, encoding="utf-8")
    csv_path = options.csv or options.submissions / "grades.csv"
    write_csv(csv_path, students, names, table, maxima)
    print()
    print_table(students, names, table, maxima)
    print(f"\nwrote {csv_path} and {FEEDBACK_FILE} in each student's folder "
          f"({time.monotonic() - started:.1f} s)")
    return 0



def cli() -> None:
    """The ``course-grade`` console script."""
    sys.exit(main(sys.argv[1:]))
