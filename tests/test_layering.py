"""Imports run one way: the grader uses the launcher, the launcher never the grader, and what keeps
processes apart and measures them (course_lib.confine) sits below both, importing neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

COURSE_LIB = Path(__file__).resolve().parents[1] / "course_lib"
# Each package, and the packages of course_lib it may not import.
BELOW = {"launcher": {"grading"}, "confine": {"grading", "launcher"}}


def imported_packages(path: Path, package: str) -> set[str]:
    """The course_lib packages a module imports, relative imports resolved (function-level ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            else:  # from ..x import y: x, from the package of this module
                parts = ["course_lib", package][: 3 - node.level] if node.level <= 2 else []
                names = [".".join([*parts, node.module]) if node.module else ".".join(parts) + "." + alias.name
                         for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("course_lib."):
                found.add(name.split(".")[1])
    return found


@pytest.mark.parametrize("package", sorted(BELOW))
def test_no_import_runs_back_up(package):
    modules = sorted((COURSE_LIB / package).glob("*.py"))
    assert modules
    wrong = {path.name: imported_packages(path, package) & BELOW[package] for path in modules}
    assert not {name: up for name, up in wrong.items() if up}, wrong


def test_the_check_sees_relative_imports():
    # The rule above would hold vacuously if relative imports were not resolved: the grader's sandbox uses confine.
    assert "confine" in imported_packages(COURSE_LIB / "grading" / "sandbox.py", "grading")
    assert "confine" in imported_packages(COURSE_LIB / "launcher" / "worker.py", "launcher")
