"""Generate the learners' exercise notebooks from the solution notebooks (``make exercises``).

Part of grading since the graded exercises (chapter 01 on): the grader derives each answer
cell's stub from here too. Usage:
    python scripts/make_exercises.py                      # every solutions/*.ipynb -> exercises/
    python scripts/make_exercises.py solutions/01_x.ipynb # only these (files or folders)
    python scripts/make_exercises.py --check              # exit 1 if exercises/ is stale

Options: --solutions DIR (default solutions/), --exercises DIR (default exercises/).

One source: ``solutions/<name>.ipynb`` holds the answers and the checks, marked with
nbgrader cell metadata. ``exercises/<name>.ipynb`` is derived from it with nbgrader's
own preprocessors, used on their own (no nbgrader database or course folder):

* ``ClearSolutions``: each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes
  ``raise NotImplementedError("Your code here: see the hint above")``, indented like the
  region, so the cell still defines its function;
* ``ClearHiddenTests``: ``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` regions
  are removed from check cells (the grader runs them from the solution notebook);
* ``ClearOutput``: outputs and execution counts are cleared.

The result is byte-for-byte the same every time (tests/test_exercises.py relies on it).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
STUB = 'raise NotImplementedError("Your code here: see the hint above")'


def _preprocessors():
    # Imported here so that `--help` works without nbgrader installed.
    from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

    return [
        ClearSolutions(code_stub={"python": STUB}, text_stub="YOUR ANSWER HERE"),
        ClearHiddenTests(),
        # Also drop the timing metadata nbclient records, so re-executing a solution
        # notebook does not make its exercise look stale.
        ClearOutput(remove_metadata_fields={"collapsed", "scrolled", "execution", "ExecuteTime"}),
    ]


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read a notebook; cells without an id get a stable one (nbformat would invent random ids)."""
    text = path.read_text(encoding="utf-8")
    raw_cells = json.loads(text).get("cells", [])
    notebook = nbformat.reads(text, as_version=4)
    if notebook.nbformat_minor < 5:
        notebook.nbformat_minor = 5
    for index, (cell, raw) in enumerate(zip(notebook.cells, raw_cells)):
        if not raw.get("id"):
            cell["id"] = f"cell-{index}"
    return notebook


def make_exercise(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The learner's copy of a solution notebook (the argument is left unchanged)."""
    exercise = copy.deepcopy(solution)
    resources: dict = {}
    for preprocessor in _preprocessors():
        exercise, resources = preprocessor.preprocess(exercise, resources)
    # What a kernel left behind in the notebook's metadata says nothing to the learner.
    exercise.metadata.pop("widgets", None)
    return exercise


def render(notebook: nbformat.NotebookNode) -> str:
    return nbformat.writes(notebook, version=4) + "\n"


def solution_paths(paths: list[str], solutions_dir: Path) -> list[Path]:
    if not paths:
        paths = [str(solutions_dir)]
    found: list[Path] = []
    for path in map(Path, paths):
        found += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def generate(solutions: list[Path], exercises_dir: Path) -> list[Path]:
    """Write exercises_dir/<name> for each solution notebook; return the paths written."""
    exercises_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for solution in solutions:
        try:
            text = render(make_exercise(read_notebook(solution)))
        except Exception as exc:  # noqa: BLE001 - say which notebook is malformed, then stop
            raise SystemExit(f"{solution}: cannot make an exercise from it: {type(exc).__name__}: {exc}")
        target = exercises_dir / solution.name
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def stale_files(solutions_dir: Path, exercises_dir: Path) -> list[str]:
    """What is out of date in exercises_dir compared with solutions_dir (empty: up to date)."""
    problems = []
    solutions = {p.name for p in solutions_dir.glob("*.ipynb")}
    exercises = {p.name for p in exercises_dir.glob("*.ipynb")} if exercises_dir.is_dir() else set()
    for name in sorted(exercises - solutions):
        problems.append(f"{exercises_dir / name}: no solution notebook {solutions_dir / name}")
    for name in sorted(solutions - exercises):
        problems.append(f"{exercises_dir / name}: missing (run `make exercises`)")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(solutions & exercises):
            fresh = generate([solutions_dir / name], Path(tmp))[0]
            if fresh.read_bytes() != (exercises_dir / name).read_bytes():
                problems.append(f"{exercises_dir / name}: stale, differs from what "
                                f"{solutions_dir / name} generates (run `make exercises`)")
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="solution notebooks or folders (default: --solutions)")
    parser.add_argument("--solutions", type=Path, default=REPO / "solutions")
    parser.add_argument("--exercises", type=Path, default=REPO / "exercises")
    parser.add_argument("--check", action="store_true", help="only report stale exercises (exit 1 if any)")
    args = parser.parse_args(argv)

    if args.check:
        problems = stale_files(args.solutions, args.exercises)
        for problem in problems:
            print(problem)
        print("exercises are up to date" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0

    written = generate(solution_paths(args.paths, args.solutions), args.exercises)
    for path in written:
        print(f"wrote {path}")
    if not args.paths:  # a full run also removes exercises whose solution is gone
        for orphan in sorted(args.exercises.glob("*.ipynb")):
            if not (args.solutions / orphan.name).exists():
                orphan.unlink()
                print(f"removed {orphan} (no solution notebook)")
    return 0
