"""Re-execute notebooks in place, top to bottom, and store their outputs.

Usage: .venv/bin/python scripts/execute_notebooks.py [--allow-busy] PATH [PATH ...]   (files or folders)

Stored outputs are what nbval compares against, so run this after editing a lesson
or a solution notebook, check the diff, and commit the notebook with its outputs.
Each notebook runs in its own folder with a fresh kernel, as JupyterLab would run it.

Stored timings are what every reader sees, so a notebook runs only on an idle machine: before
each one this waits (up to 3 minutes) for the 1-minute load average to fall to half the cores,
and refuses if it does not. ``--allow-busy`` runs anyway; every timing cell prints its hardware
line, load average included, so the stored output then says how busy the machine was.

A notebook that runs jobs on the course's Slurm cluster when one answers (chapter 04) would store
"skipped" if the controller happened to be down, and nbval then fails wherever a cluster answers:
such a notebook runs only while `scontrol ping` answers (`make slurm-up`), unless ``--without-slurm``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# The load the timing cells' hardware line prints, judged against the cores it counts.
from course_lib.hardware import cpu_name, load_average  # noqa: E402
from course_lib.launcher import available_cpus  # noqa: E402
from course_lib.slurm import cluster_up, why_no_cluster  # noqa: E402

IDLE_WAIT_S = 180
REPO = Path(__file__).resolve().parent.parent
# How long each notebook took, top to bottom, the last time it was stored: the README's chapter
# table and docs/instructors.md's agenda are computed from it (scripts/chapter_minutes.py).
RUN_TIMES = REPO / "docs" / "run_times.json"


def record(measurements: Path, notebook: Path, **figures) -> None:
    """Store ``figures`` for ``notebook`` in a JSON file of per-notebook measurements (run times
    here, peak memory in scripts/notebook_memory.py), with the date and machine they came from."""
    table = json.loads(measurements.read_text()) if measurements.exists() else {}
    table[notebook.resolve().relative_to(REPO).as_posix()] = {
        **figures, "date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": available_cpus()}
    measurements.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")


def record_run_time(path: Path, seconds: float, load: float | None, silence: tuple[float, int]) -> None:
    load_at_start = None if load is None else round(load, 1)
    longest_s, at_cell = silence
    record(RUN_TIMES, path, seconds=round(seconds, 1), **{"load average at start": load_at_start,
                                                          "longest silence s": round(longest_s, 1),
                                                          "longest silence at cell": at_cell})


# What a learner sees a cell do: it starts, prints, draws or updates a display (a progress bar, a
# launch's live view, a widget), ends. The longest gap between two of these is the longest the learner
# watched a cell with nothing happening (tests/test_notebook_conventions.py bounds it).
SHOWN = {"stream", "display_data", "update_display_data", "execute_result", "error", "comm_msg"}


class SilenceTimer(NotebookClient):
    """A NotebookClient that notes, per cell, when the kernel sent each thing a learner sees."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shown_at: dict[int, list] = {}

    def process_message(self, msg, cell, cell_index):
        if msg["msg_type"] in SHOWN or msg["msg_type"] == "status":  # status: the cell's start and end
            self.shown_at.setdefault(cell_index, []).append(msg["header"]["date"])
        return super().process_message(msg, cell, cell_index)

    def longest_silence(self) -> tuple[float, int]:
        """(seconds, cell index) of the longest time any cell showed nothing new."""
        gaps = [((later - earlier).total_seconds(), index) for index, times in self.shown_at.items()
                for earlier, later in zip(times, times[1:])]
        return max(gaps, default=(0.0, -1))


def notebooks_in(paths: list[str]) -> list[Path]:
    found = []
    for path in map(Path, paths):
        found += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    return [nb for nb in found if ".ipynb_checkpoints" not in nb.parts]


def run(path: Path, timeout: int = 600):
    """The notebook at ``path``, executed top to bottom in a fresh kernel in its own folder, and its
    longest silence (seconds, cell index)."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)  # wall-clock stamps: noise in every diff
    client = SilenceTimer(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                          resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    return notebook, client.longest_silence()


def execute(path: Path, timeout: int = 600) -> tuple[float, tuple[float, int]]:
    started = time.perf_counter()
    notebook, silence = run(path, timeout)
    nbformat.write(notebook, path)
    return time.perf_counter() - started, silence


def wait_until_idle(wait_s: float = IDLE_WAIT_S) -> str | None:
    """None once the load average is at most half the cores; else why the machine is too busy."""
    cores = available_cpus()
    deadline = time.monotonic() + wait_s
    while True:
        load = load_average()
        if load is None or load <= cores / 2:  # None: no load average here (Windows)
            return None
        if time.monotonic() > deadline:
            return (f"the machine is busy (load average {load:.1f} on {cores} cores, more than half of them after "
                    f"waiting {wait_s:g} s): timings stored now would show the other work. Stop it and run again, "
                    "or pass --allow-busy (the timing cells' hardware line then shows the load)")
        time.sleep(5)


def needs_slurm(path: Path) -> bool:
    """Whether the notebook's stored output depends on a Slurm cluster answering."""
    return "slurm.cluster_up()" in path.read_text()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Files or folders of notebooks; see the module docstring.")
    parser.add_argument("paths", nargs="+", help="notebooks, or folders of them")
    parser.add_argument("--allow-busy", action="store_true", help="run even when the machine is not idle")
    parser.add_argument("--without-slurm", action="store_true",
                        help="store a Slurm chapter's outputs even when no cluster answers (its jobs then say skipped)")
    options = parser.parse_args(argv)
    for path in notebooks_in(options.paths):
        if not path.exists():
            print(f"{path}: no such notebook", file=sys.stderr)
            return 2
        if needs_slurm(path) and not options.without_slurm and not cluster_up():
            print(f"{path}: not executed: its Slurm cells would store 'skipped' ({why_no_cluster()}). "
                  "Start the course's cluster with `make slurm-up` (as root), or pass --without-slurm", file=sys.stderr)
            return 1
        busy = None if options.allow_busy else wait_until_idle()
        if busy:
            print(f"{path}: not executed: {busy}", file=sys.stderr)
            return 1
        load = load_average()
        seconds, silence = execute(path)
        if path.resolve().is_relative_to(REPO):
            record_run_time(path, seconds, load, silence)
        print(f"{path}: executed in {seconds:.1f} s (load average "
              f"{'unknown' if load is None else f'{load:.1f}'} when it started); longest silence "
              f"{silence[0]:.1f} s, in cell {silence[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
