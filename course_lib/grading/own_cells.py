"""pytest plugin: the grader's own cells run under a time limit of their own (grading, step 2).

A merged notebook's recorder cell, the reference's setup before its first answer or check, and
the cell that starts each submission's sandbox hold none of a student's code. On a busy machine
(a class graded with many jobs on few cores) a setup that imports torch and loads data can take
longer than a student's cell may, and failing it would leave the whole batch "not graded". So
``scripts/grade.py`` names those cells (``--grader-own-cells``) and their limit
(``--grader-own-cell-timeout``, grade.py's ``--setup-timeout``), and this plugin lends each of
them that limit while nbval runs it; every other cell keeps ``--nbval-cell-timeout``.
"""

from __future__ import annotations

import re

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("course grading")
    group.addoption("--grader-own-cells", default="", help="comma-separated code cell numbers run under the "
                    "grader's own time limit")
    group.addoption("--grader-own-cell-timeout", type=float, default=None,
                    help="seconds each of those cells may run")


# The cell numbers, parsed once per pytest run and kept on that run's config (not in module state,
# which a second run in the same process would inherit).
OWN_CELLS = pytest.StashKey[frozenset]()


def pytest_configure(config):
    numbers = config.option.grader_own_cells.split(",")
    config.stash[OWN_CELLS] = frozenset(int(number) for number in numbers if number.strip())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    # nbval reads config.option.nbval_cell_timeout as it runs each cell (its runtest)
    match = re.fullmatch(r"Cell (\d+)", item.name)
    limit = item.config.option.grader_own_cell_timeout
    if match is None or limit is None or int(match[1]) not in item.config.stash[OWN_CELLS]:
        yield
        return
    usual = item.config.option.nbval_cell_timeout
    item.config.option.nbval_cell_timeout = limit
    try:
        yield
    finally:
        item.config.option.nbval_cell_timeout = usual
