"""Conventions every lesson keeps, read from the notebooks' sources (no kernel needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LESSONS = sorted((REPO / "notebooks").glob("*.ipynb"))
TIMER = re.compile(r"perf_counter|time\.monotonic\(|median_of\(|best_of\(|\bseconds\(|time\.time\(")
PRINTED_LOAD = re.compile(r"print\(\w*load\)")   # a course_lib.hardware.MachineLoad: both lines


def timing_cells_without_hardware_line(path: Path) -> list[int]:
    """Cells that time something, store what they print un-compared, and do not say where it ran."""
    cells = json.loads(path.read_text())["cells"]
    return [index for index, cell in enumerate(cells) if cell["cell_type"] == "code"
            for source in ["".join(cell["source"])]
            if "NBVAL_IGNORE_OUTPUT" in source and TIMER.search(source) and "hardware_line(" not in source
            and not PRINTED_LOAD.search(source)]


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


HARDWARE_LINE = re.compile(r"(\d+) CPU cores usable, load average ([0-9.]+)")


def cell_texts(path: Path):
    """(index, the text of all its stored outputs) of each cell."""
    for index, cell in enumerate(json.loads(path.read_text())["cells"]):
        texts = [output.get("text", "") for output in cell.get("outputs", [])]
        yield index, "".join("".join(t) if isinstance(t, list) else t for t in texts)


def loaded_timings(path: Path) -> list[tuple[int, float, int]]:
    """(cell, load average, cores) of each stored hardware line taken with more than twice as much runnable
    work as cores: a timing measured while other programs crowded the machine. (The 1-minute load average
    also counts the notebook's own ranks, up to 8 on the course's 2 cores for a few seconds at a time, so
    a quiet machine's line may read above the core count; a crowded one's reads 5 to 9.)"""
    return [(index, float(load), int(cores)) for index, text in cell_texts(path)
            for cores, load in HARDWARE_LINE.findall(text) if float(load) > 2 * int(cores)]


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.name)
def test_every_stored_timing_was_taken_on_a_quiet_machine(path):
    # A stored timing is a claim about the hardware printed beside it; measured while other programs kept
    # the machine crowded, it is a claim about the crowd. Execute such a notebook again on a quiet machine
    # (scripts/execute_notebooks.py refuses a busy one).
    assert loaded_timings(path) == []


def test_the_quiet_machine_rule_catches_a_loaded_timing(tmp_path):
    line = "AMD EPYC, 2 CPU cores usable, load average {}, no GPU, torch 2.15.0\n"
    notebook = {"cells": [{"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "name": "stdout",
                                                                            "text": [line.format("3.9")]}]},
                          {"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "name": "stdout",
                                                                            "text": line.format("4.6")}]}]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    assert loaded_timings(path) == [(1, 4.6, 2)]


FREE_CORES = re.compile(r"([0-9.]+) of (\d+) cores free")


def timings_without_their_after_line(path: Path) -> list[int]:
    """Cells whose stored output says where a timing ran, but not the load it ended at."""
    return [index for index, text in cell_texts(path)
            if HARDWARE_LINE.search(text) and "after the measurement:" not in text]


def timings_on_busy_cores(path: Path) -> list[tuple[int, float, int]]:
    """(cell, free cores, cores) of each stored reading, before or after a timing, with less than three
    quarters of the cores free: another program shared the cores the timing measured."""
    return [(index, float(free), int(cores)) for index, text in cell_texts(path)
            for free, cores in FREE_CORES.findall(text) if float(free) < 0.75 * int(cores)]


@pytest.mark.parametrize("path", LESSONS, ids=lambda path: path.name)
def test_every_stored_timing_shows_the_load_before_and_after_it(path):
    # The load guard of scripts/execute_notebooks.py runs once, when a notebook starts; each timing
    # reads the cores free just before and just after it measures (course_lib.hardware.machine_load).
    assert timings_without_their_after_line(path) == []
    assert timings_on_busy_cores(path) == []


def test_the_before_and_after_rules_catch_what_they_are_for(tmp_path):
    before = "AMD EPYC, 2 CPU cores usable, load average 0.3, {} of 2 cores free, no GPU, torch 2.15.0\n"
    after = "after the measurement: load average 0.4, {} of 2 cores free\n"
    outputs = [[before.format("1.9")],                                  # no after line
               [before.format("2.0"), "12.0 ms\n", after.format("1.0")],  # another program came in meanwhile
               [before.format("1.4"), after.format("1.9")],              # it was there before
               [before.format("1.9"), after.format("2.0")]]              # as it should be
    notebook = {"cells": [{"cell_type": "code", "source": [], "outputs": [{"output_type": "stream", "name": "stdout",
                                                                           "text": text}]} for text in outputs]}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(notebook))
    assert timings_without_their_after_line(path) == [0]
    assert timings_on_busy_cores(path) == [(1, 1.0, 2), (2, 1.4, 2)]


# A learner watching a cell that shows nothing for longer than this wonders whether it hangs: a
# longer step prints a line per stage, draws a progress bar, or runs in a launch (whose live view
# shows the ranks' latest lines). scripts/execute_notebooks.py measures each notebook's longest
# silence, on an idle machine, every time it stores the notebook's outputs.
SILENT_AT_MOST_S = 5.0
RUN_TIMES = REPO / "docs" / "run_times.json"
EXECUTED = LESSONS + sorted((REPO / "solutions").glob("*.ipynb"))


def silences_too_long(run_times: dict) -> dict[str, tuple[float, int]]:
    return {name: (entry["longest silence s"], entry["longest silence at cell"]) for name, entry in run_times.items()
            if entry["longest silence s"] > SILENT_AT_MOST_S}


@pytest.mark.parametrize("path", EXECUTED, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_cell_is_silent_for_more_than_five_seconds(path):
    entry = json.loads(RUN_TIMES.read_text()).get(path.relative_to(REPO).as_posix(), {})
    assert "longest silence s" in entry, (f"{path.name}: no measured silence in docs/run_times.json; store it with "
                                          "`.venv/bin/python scripts/execute_notebooks.py` on an idle machine")
    assert not silences_too_long({path.name: entry}), (
        f"{path.name}: cell {entry['longest silence at cell']} showed nothing for {entry['longest silence s']} s "
        f"(at most {SILENT_AT_MOST_S:g}): print a line per stage or show progress, then store the notebook again")


def test_the_silence_rule_catches_a_silent_cell():
    entries = {"quiet.ipynb": {"longest silence s": 5.1, "longest silence at cell": 7},
               "talks.ipynb": {"longest silence s": 5.0, "longest silence at cell": 3}}
    assert silences_too_long(entries) == {"quiet.ipynb": (5.1, 7)}
