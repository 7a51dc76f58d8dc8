"""exercises/ is generated from solutions/ by scripts/make_exercises.py, and must be up to date.

If test_committed_exercises_are_up_to_date fails: run `make exercises` and commit exercises/.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "solutions"
sys.path.insert(0, str(REPO / "scripts"))
import make_exercises  # noqa: E402
from make_exercises import STUB, generate, make_exercise, read_notebook, stale_files  # noqa: E402


def test_committed_exercises_are_up_to_date():
    # Also fails for an exercise without a solution notebook, or a solution without an exercise.
    assert stale_files(REPO / "solutions", REPO / "exercises") == []


def test_generation_is_byte_for_byte_repeatable(tmp_path):
    first = generate(sorted(FIXTURES.glob("*.ipynb")), tmp_path / "a")
    second = generate(sorted(FIXTURES.glob("*.ipynb")), tmp_path / "b")
    assert [p.name for p in first] == [p.name for p in second] == ["tiny_basics.ipynb", "tiny_collectives.ipynb"]
    for a, b in zip(first, second):
        assert a.read_bytes() == b.read_bytes()


def nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def test_exercise_has_stubs_and_no_solutions_hidden_tests_or_outputs():
    solution = read_notebook(FIXTURES / "tiny_collectives.ipynb")
    exercise = make_exercise(solution)
    assert [c.id for c in exercise.cells] == [c.id for c in solution.cells]
    assert [nbgrader(c) for c in exercise.cells] == [nbgrader(c) for c in solution.cells]  # grade_ids kept
    text = nbformat.writes(exercise)
    for gone in ("BEGIN SOLUTION", "END SOLUTION", "HIDDEN TESTS", "hidden_probe_rank1", "dist.all_reduce(value)"):
        assert gone not in text
    answers = [c for c in exercise.cells if nbgrader(c).get("solution")]
    assert len(answers) == 3
    for cell in answers:
        assert STUB in cell.source and "# Hint:" in cell.source
        compile(cell.source, "<answer>", "exec")  # the stubbed cell still defines its function
    for cell in exercise.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
            assert "execution" not in cell.metadata  # nbclient's timings would make exercises churn
    checks = [c for c in exercise.cells if nbgrader(c).get("grade")]
    assert all("with checking(" in c.source and "launch(" in c.source for c in checks)  # visible checks stay
    assert solution.cells[4].source.count("BEGIN HIDDEN TESTS") == 1  # the source is left unchanged


def test_stale_missing_and_orphan_exercises_are_reported(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(FIXTURES, solutions, ignore=shutil.ignore_patterns("*.py"))
    generate(sorted(solutions.glob("*.ipynb")), exercises)
    assert stale_files(solutions, exercises) == []

    notebook = nbformat.read(solutions / "tiny_basics.ipynb", as_version=4)
    notebook.cells[0].source += "\nOne more sentence."
    nbformat.write(notebook, solutions / "tiny_basics.ipynb")
    (exercises / "orphan.ipynb").write_text((exercises / "tiny_basics.ipynb").read_text())
    (exercises / "tiny_collectives.ipynb").unlink()
    problems = "\n".join(stale_files(solutions, exercises))
    assert re.search(r"tiny_basics\.ipynb: stale", problems)
    assert re.search(r"orphan\.ipynb: no solution notebook", problems)
    assert re.search(r"tiny_collectives\.ipynb: missing", problems)

    dirs = ["--solutions", str(solutions), "--exercises", str(exercises)]
    assert make_exercises.main([*dirs, "--check"]) == 1
    assert make_exercises.main(dirs) == 0  # a full run also removes the orphan
    assert make_exercises.main([*dirs, "--check"]) == 0
    assert sorted(p.name for p in exercises.iterdir()) == ["tiny_basics.ipynb", "tiny_collectives.ipynb"]


def answered_copy(path: Path, how: str) -> None:
    """A learner's work in an exercise notebook: an answer typed in, a cell run, or a cell added."""
    notebook = nbformat.read(path, as_version=4)
    if how == "answer":
        cell = next(c for c in notebook.cells if nbgrader(c).get("solution"))
        cell.source = cell.source.replace(STUB, "return x + x  # my answer")
    elif how == "ran":
        cell = next(c for c in notebook.cells if c.cell_type == "code")
        cell.execution_count = 1
    else:
        notebook.cells.append(nbformat.v4.new_markdown_cell("my notes"))
    nbformat.write(notebook, path)


def test_make_exercises_never_overwrites_or_removes_a_learners_work(tmp_path):
    """`make exercises` over an exercises/ folder a learner worked in: every answered, run or extended notebook
    is kept in exercises/answers-kept/ (and the script says where) before a fresh copy is written; the
    grader does not call the answered copy stale, and the check names where `make exercises` would keep it."""
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    shutil.copytree(FIXTURES, solutions, ignore=shutil.ignore_patterns("*.py"))
    generate(sorted(solutions.glob("*.ipynb")), exercises)
    answered_copy(exercises / "tiny_basics.ipynb", "answer")
    answered_copy(exercises / "tiny_collectives.ipynb", "ran")
    (exercises / "my_notes.ipynb").write_text((exercises / "tiny_basics.ipynb").read_text())  # no solution
    answered_copy(exercises / "my_notes.ipynb", "added")
    work = {name: (exercises / name).read_bytes() for name in ("tiny_basics.ipynb", "tiny_collectives.ipynb",
                                                              "my_notes.ipynb")}

    assert stale_files(solutions, exercises, worked_on=False) == [
        f"{exercises / 'my_notes.ipynb'}: no solution notebook {solutions / 'my_notes.ipynb'}"]
    problems = stale_files(solutions, exercises)
    assert len(problems) == 3 and all("answers-kept" in line for line in problems if "holds answers" in line)

    dirs = ["--solutions", str(solutions), "--exercises", str(exercises)]
    assert make_exercises.main(dirs) == 0
    kept = sorted((exercises / "answers-kept").iterdir())
    assert sorted(p.read_bytes() for p in kept) == sorted(work.values())  # every byte of the work, kept
    assert sorted(p.name for p in exercises.glob("*.ipynb")) == ["tiny_basics.ipynb", "tiny_collectives.ipynb"]
    assert stale_files(solutions, exercises) == []  # fresh copies; the kept ones are not taken for exercises
    assert make_exercises.main(dirs) == 0 and len(list((exercises / "answers-kept").iterdir())) == 3  # nothing new


def test_learner_sees_a_short_not_implemented_message(tmp_path):
    """Running the untouched exercise: the check fails with one explained line, no traceback."""
    exercise = make_exercise(read_notebook(FIXTURES / "tiny_basics.ipynb"))
    NotebookClient(exercise, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    check = next(c for c in exercise.cells if nbgrader(c).get("grade"))
    errors = [o for o in check.outputs if o.output_type == "error"]
    assert len(errors) == 1 and errors[0].ename == "CheckFailed"
    assert errors[0].traceback == [
        "\u2718 FAILED double: not implemented yet\n  hint: replace `raise NotImplementedError` with your code"
    ]


def test_nbgrader_is_a_declared_dependency():
    pyproject = (REPO / "pyproject.toml").read_text()
    environment = (REPO / "environment.yml").read_text()
    specifier = re.search(r'"(nbgrader[^"]*)"', pyproject)[1]
    assert re.search(rf"^\s*- {re.escape(specifier)}\s*$", environment, re.M)
