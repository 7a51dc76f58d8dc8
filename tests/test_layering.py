"""Imports run one way: the grader uses the launcher, the launcher never the grader, and what keeps
processes apart and measures them (course_lib.confine) sits below both, importing neither. Above them
all, the chapters' check helpers (course_lib/grading/chapterNN.py): only a notebook imports them."""

from __future__ import annotations

import ast
import re
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


CHAPTER = re.compile(r"chapter\d+")  # course_lib/grading/chapter01.py: what chapter 01's setup cell imports


def imports_a_chapter(path: Path) -> bool:
    """Whether a module imports one of the chapters' check helpers, in any spelling (relative, absolute, from a package)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(alias.name for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any(CHAPTER.fullmatch(part) for name in names for part in name.split(".")):
            return True
    return False


def test_no_module_of_course_lib_imports_a_chapters_checks():
    # A chapter's helpers sit above the tools they use; a tool that imported them would tie every chapter to one.
    chapters = sorted((COURSE_LIB / "grading").glob("chapter*.py"))
    assert chapters
    wrong = [path.relative_to(COURSE_LIB).as_posix() for path in sorted(COURSE_LIB.rglob("*.py"))
             if imports_a_chapter(path)]
    assert not wrong, wrong


def test_the_chapter_rule_sees_every_spelling(tmp_path):
    for line in ("from .chapter01 import expect_only", "from . import chapter08",
                 "import course_lib.grading.chapter03", "from course_lib.grading.chapter06 import device"):
        (tmp_path / "tool.py").write_text(line + "\n")
        assert imports_a_chapter(tmp_path / "tool.py"), line
    (tmp_path / "tool.py").write_text("from .checks import expect\n")
    assert not imports_a_chapter(tmp_path / "tool.py")
