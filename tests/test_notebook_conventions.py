"""Conventions every lesson keeps, read from the notebooks' sources (no kernel needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LESSONS = sorted((REPO / "notebooks").glob("*.ipynb"))
TIMER = re.compile(r"perf_counter|time\.monotonic\(|median_of\(|best_of\(|\bseconds\(|time\.time\(")


def timing_cells_without_hardware_line(path: Path) -> list[int]:
    """Cells that time something, store what they print un-compared, and do not say where it ran."""
    cells = json.loads(path.read_text())["cells"]
    return [index for index, cell in enumerate(cells) if cell["cell_type"] == "code"
            for source in ["".join(cell["source"])]
            if "NBVAL_IGNORE_OUTPUT" in source and TIMER.search(source) and "hardware_line(" not in source]


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.name)
def test_every_timing_cell_prints_where_it_ran(path):
    # A stored timing is read by everyone who opens the notebook: it must show the CPU, the cores and
    # the load it was measured at (course_lib.hardware.hardware_line).
    assert timing_cells_without_hardware_line(path) == []


def test_the_timing_rule_catches_a_timing_cell_without_its_line(tmp_path):
    notebook = {"cells": [{"cell_type": "code", "source": ["# NBVAL_IGNORE_OUTPUT\n",
                                                            "print(median_of(step))\n"]},
                          {"cell_type": "code", "source": ["# NBVAL_IGNORE_OUTPUT\n", "print(hardware_line())\n",
                                                            "print(median_of(step))\n"]}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    assert timing_cells_without_hardware_line(path) == [0]
