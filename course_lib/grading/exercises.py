"""Generate the learners' exercise notebooks from the solution notebooks (``make exercises``).

Part of grading since the graded exercises (chapter 01 on): the grader derives each answer
cell's stub from here too. Usage:
    .venv/bin/python scripts/make_exercises.py                      # every solutions/*.ipynb -> exercises/
    .venv/bin/python scripts/make_exercises.py solutions/01_x.ipynb # only these (files or folders)
    .venv/bin/python scripts/make_exercises.py --check              # exit 1 if exercises/ is stale

A notebook in exercises/ that holds someone's work (answers, outputs, added cells) is never
overwritten or removed: it is moved into exercises/answers-kept/ first, and the script says where.

Options: --solutions DIR (default solutions/), --exercises DIR (default exercises/).

One source: ``solutions/<name>.ipynb`` holds the answers and the checks, marked with
nbgrader cell metadata. ``exercises/<name>.ipynb`` is derived from it with nbgrader's
own preprocessors, used on their own (no nbgrader database or course folder):

* ``ClearSolutions``: each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region becomes
  ``raise NotImplementedError("Your code here")``, indented like the
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
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]
STUB = 'raise NotImplementedError("Your code here")'


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


# Where `make exercises` moves an exercise notebook that holds someone's work before it writes a fresh
# one: a sub-folder, so that the grader (which takes every *.ipynb in exercises/ for an exercise) never
# mistakes a kept copy for one.
KEPT = "answers-kept"


def holds_work(path: Path) -> bool:
    """Whether an exercise notebook holds someone's work, which no regeneration may overwrite: an answer
    cell that is no longer its stub, a cell that was run (outputs, an execution count), a cell that was
    added, or a file that cannot be read as a notebook (then nothing can say it does not)."""
    try:
        notebook = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
    except Exception:  # noqa: BLE001 - unreadable: keep it
        return True
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            return True
        if isinstance(meta, dict) and meta.get("solution") and cell.get("cell_type") == "code" \
                and STUB not in cell.get("source", ""):
            return True
        if not isinstance(meta, dict) or not meta.get("grade_id"):
            return True  # a cell the learner added (every generated cell carries its grade_id)
    return False


def keep_work(path: Path) -> Path:
    """Move ``path`` (a notebook holding someone's work) into exercises/answers-kept/, under a name of its
    own (its stem and the time); return where it went."""
    folder = path.parent / KEPT
    folder.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = folder / f"{path.stem}-{stamp}.ipynb"
    number = 1
    while target.exists():
        number += 1
        target = folder / f"{path.stem}-{stamp}-{number}.ipynb"
    path.rename(target)
    return target


def generate(solutions: list[Path], exercises_dir: Path, kept: list[tuple[Path, Path]] | None = None) -> list[Path]:
    """Write exercises_dir/<name> for each solution notebook; return the paths written. An exercise that
    holds someone's work is first moved into exercises_dir/answers-kept/ (``kept`` gets (from, to))."""
    exercises_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for solution in solutions:
        try:
            text = render(make_exercise(read_notebook(solution)))
        except Exception as exc:  # noqa: BLE001 - say which notebook is malformed, then stop
            raise SystemExit(f"{solution}: cannot make an exercise from it: {type(exc).__name__}: {exc}")
        target = exercises_dir / solution.name
        if target.exists() and target.read_text(encoding="utf-8", errors="replace") != text and holds_work(target):
            moved = keep_work(target)
            if kept is not None:
                kept.append((target, moved))
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def stale_files(solutions_dir: Path, exercises_dir: Path, worked_on: bool = True) -> list[str]:
    """What is out of date in exercises_dir compared with solutions_dir (empty: up to date). With
    ``worked_on=False``, notebooks that hold someone's work are not reported (a learner grading their own
    answered copy: it differs from the generated one by design)."""
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
            if fresh.read_bytes() == (exercises_dir / name).read_bytes():
                continue
            if not holds_work(exercises_dir / name):
                problems.append(f"{exercises_dir / name}: stale, differs from what "
                                f"{solutions_dir / name} generates (run `make exercises`)")
            elif worked_on:
                problems.append(f"{exercises_dir / name}: holds answers or outputs, so it differs from what "
                                f"{solutions_dir / name} generates (`make exercises` would keep it in "
                                f"{exercises_dir / KEPT}/ and write a fresh copy)")
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

    kept: list[tuple[Path, Path]] = []
    written = generate(solution_paths(args.paths, args.solutions), args.exercises, kept)
    for path in written:
        print(f"wrote {path}")
    if not args.paths:  # a full run also removes exercises whose solution is gone
        for orphan in sorted(args.exercises.glob("*.ipynb")):
            if not (args.solutions / orphan.name).exists():
                if holds_work(orphan):
                    kept.append((orphan, keep_work(orphan)))
                else:
                    orphan.unlink()
                    print(f"removed {orphan} (no solution notebook)")
    for old, moved in kept:  # never lost: say where each went
        print(f"kept the work in {old} as {moved}")
    return 0
