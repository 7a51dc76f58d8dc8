"""Merging: a submission's answers put into the reference notebook, ready for nbval (grading, step 1).

The reference is the solution notebook. Each answer cell (nbgrader metadata ``solution: true``)
gets the source of the student's cell with the same ``grade_id``, as text for the learner side; a
deleted answer cell gets the exercise's stub. Every other cell, the check cells with their hidden
tests included, comes from the reference. One merged notebook may hold several submissions of
an exercise in turn, for one judge (``merge_many``).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .exercises import make_exercise, read_notebook

# Runs first in every graded notebook. The kernel becomes the judge (non-dumpable, its hidden
# seed read from a file that is then deleted), and writes after each cell a sealed line saying how the
# cell ended (course_lib.grading.proof): a check passes only on that line, and the feedback quotes the
# exception's type and message from it, without the traceback and its source lines.
RECORDER_CELL = '''\
# Added by the grader: this kernel is the judge; it records how each cell ended.
def _course_grader_setup():
    import os
    import course_lib.grading.judge
    course_lib.grading.judge.become_judge()
    course_lib.grading.judge.record_cells(os.environ.pop("COURSE_GRADER_RECORD"))
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
CHECK_NAME = re.compile(r"""checking\(\s*(?P<q>["'])(?P<name>.+?)(?P=q)""")


def check_label(source: str) -> str | None:
    """The title a check cell passes to ``checking(...)``: its first argument when that is a string constant,
    read with Python's parser, so a title written as two literals on two lines is whole (the regular
    expression alone stopped at the first closing quote). None where there is no such call."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "checking"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            return node.args[0].value
    match = CHECK_NAME.search(source)  # an f-string title, or a cell Python cannot parse
    return match["name"] if match else None


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
            label = check_label(cell.source) or grade_id
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
# A submission: the student's notebook and its answers
# --------------------------------------------------------------------------
# A notebook with its outputs is a few MB; one far larger is not a submission, and reading it whole
# would take the grader's memory.
SUBMISSION_BYTES = 64 * 1024 * 1024
# A notebook's JSON is a few levels deep (10 at most in this course) and holds a few thousand objects
# and lists. A file nested or packed far beyond that is not a notebook: parsing it would overflow
# Python's stack, and nbformat, which builds and validates every object again, took 12 GB of memory
# and 100 s on 60 MB of empty cells.
NOTEBOOK_DEPTH = 100
NOTEBOOK_CONTAINERS = 200_000


def too_large(size: int, limit: int) -> ValueError:
    return ValueError(f"the file is {size / 2**20:.0f} MiB, more than a notebook's {limit // 2**20} MiB: "
                      "clear its outputs (Edit > Clear Outputs of All Cells)")


def read_regular_file(path: Path, limit: int = SUBMISSION_BYTES) -> bytes:
    """The bytes of a plain file that is itself in the student's folder, or ValueError saying why not.

    A symbolic link would let a student hand in a classmate's notebook (or a solution) as their own:
    the grader runs with the rights of whoever collected the class. A named pipe would stop the
    grading of the whole class at the read. So the file is opened without following a link and
    without blocking, and read only if it is a plain file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise ValueError(f"{path.name} is a symbolic link, not the notebook itself: hand in the file") from None
        raise ValueError(f"the file cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ValueError(f"{path.name} is a folder, not a notebook: hand in the notebook file itself")
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path.name} is not a plain file: hand in the notebook itself")
        if info.st_size > limit:
            raise too_large(info.st_size, limit)
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ValueError(f"the file cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew after it was measured
        raise too_large(len(data), limit)
    return data


def read_submission(path: Path) -> nbformat.NotebookNode:
    """The student's notebook, or ValueError saying why it cannot be read."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the file is not a notebook (not UTF-8 text)") from None
    data = parse_json(text)
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")), list):
        raise ValueError("the file is not a Jupyter notebook (no list of cells)")
    check_size_of_json(data)
    try:
        with contextlib.redirect_stderr(None):
            return nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many kinds (RecursionError, MemoryError too)
        raise ValueError(f"the notebook cannot be read ({type(exc).__name__}: {exc})") from None


def nested_too_deeply() -> ValueError:
    return ValueError(f"the file is not a notebook (its JSON is nested more than {NOTEBOOK_DEPTH} levels deep)")


def parse_json(text: str):
    """The JSON value in text, or ValueError saying why not: never an error that would stop the class."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the file is not a notebook (not valid JSON: {exc})") from None
    except RecursionError:  # deeper than Python's stack allows, so deeper than NOTEBOOK_DEPTH too
        raise nested_too_deeply() from None
    except MemoryError:
        raise ValueError("the file is not a notebook (parsing it took more memory than the grader has)") from None
    except ValueError as exc:  # a number of thousands of digits, say
        raise ValueError(f"the file is not a notebook ({exc})") from None


def check_size_of_json(data) -> None:
    """ValueError when data is nested deeper, or holds more objects and lists, than any notebook.

    Walked with a stack of iterators, not recursion (which the depth could overflow), opening one
    object or list at a time, so that it stops as soon as a limit is passed.
    """
    open_containers, count = [iter([data])], 0
    while open_containers:
        for value in open_containers[-1]:
            if isinstance(value, (dict, list)):
                count += 1
                if len(open_containers) > NOTEBOOK_DEPTH:
                    raise nested_too_deeply()
                if count > NOTEBOOK_CONTAINERS:
                    raise ValueError(f"the file is not a notebook (its JSON holds more than {NOTEBOOK_CONTAINERS:,} "
                                     "objects and lists)")
                open_containers.append(iter(value.values() if isinstance(value, dict) else value))
                break  # go into it; the rest of this one comes after
        else:  # every value of the innermost one seen
            open_containers.pop()


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


# --------------------------------------------------------------------------
# Merging submissions into the reference
# --------------------------------------------------------------------------
def without_nbval_markers(cell) -> None:
    """Graded and answer cells must pass only by running cleanly: no skip, no 'raises' markers."""
    cell.source = "\n".join(line for line in cell.source.split("\n") if not NBVAL_MARKER.match(line))
    tags = cell.metadata.get("tags")
    if isinstance(tags, list):
        cell.metadata["tags"] = [tag for tag in tags if tag not in NBVAL_TAGS]


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


def copy_of_cell(ref_cells: list[dict], index: int, tag: str) -> nbformat.NotebookNode:
    """A fresh copy of one reference cell; tagged copies get an id of their own."""
    cell = nbformat.from_dict(json.loads(json.dumps(ref_cells[index])))
    if tag:
        cell["id"] = f"{tag}-{index}"  # cell ids must stay unique in the merged notebook
    return cell


def submission_cells(reference: Reference, ref_cells: list[dict], split: int | None, number: int,
                     answers: dict[str, str]) -> tuple[list[tuple], list[str]]:
    """One submission's part of the merged notebook, each cell with its (submission, reference
    index), and the submission's notes: the marker that starts it (when batched), then the
    reference's cells from split on, with this submission's answers in its answer cells."""
    answer_index = {index: grade_id for grade_id, index in reference.answer_ids.items()}
    graded_cells = {check.cell_index for check in reference.checks} | set(answer_index)
    cells, notes = [], []
    tag = f"s{number}" if split is not None else ""
    if split is not None:
        marker = nbformat.v4.new_code_cell(NEXT_SUBMISSION_CELL)
        marker.id = f"course-grader-next-{number}"
        cells.append((marker, (number, NEXT_MARKER)))
    for index in range(split or 0, len(ref_cells)):
        cell = copy_of_cell(ref_cells, index, tag)
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
    return cells, notes


def numbered_notebook(template: dict, cells: list[tuple], submissions: int
                      ) -> tuple[nbformat.NotebookNode, list[dict[int, int]]]:
    """The merged notebook, its code cells counted as run, and each submission's places
    (reference cell -> nbval's cell number); cells run once are in every submission's places."""
    merged = nbformat.from_dict(dict(template, cells=[]))
    places: list[dict[int, int]] = [{} for _ in range(submissions)]
    count = 0
    for cell, where in cells:
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count  # nbval treats a cell without a count as never run
            cell.outputs = []
            if where is not None:
                owner, index = where
                for number in (range(submissions) if owner == "once" else [owner]):
                    places[number][index] = count - 1  # nbval numbers code cells from 0
        merged.cells.append(cell)
    return merged, places


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
    recorder = nbformat.v4.new_code_cell(RECORDER_CELL)
    recorder.id = "course-grader-recorder"
    cells: list[tuple] = [(recorder, None)]
    cells += [(copy_of_cell(ref_cells, index, ""), ("once", index)) for index in range(split or 0)]
    all_notes = []
    for number, answers in enumerate(submissions):
        own_cells, notes = submission_cells(reference, ref_cells, split, number, answers)
        cells += own_cells
        all_notes.append(notes)
    merged, places = numbered_notebook(template, cells, len(submissions))
    return merged, places, all_notes


def merge(reference: Reference, answers: dict[str, str]) -> tuple[nbformat.NotebookNode, list[str]]:
    """The reference notebook with one student's answers in it, ready for nbval."""
    merged, _, notes = merge_many(reference, [answers])
    return merged, notes[0]
