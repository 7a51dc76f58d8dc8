"""Running: one merged notebook under pytest and nbval, every process it starts accounted for
(grading, step 2).

nbval runs the merged notebook top to bottom in a fresh kernel, the judge. Each cell's outcome
comes back on a pipe only pytest holds (course_lib.grading.verdicts), and how each cell ended, sealed,
from the judge's own record file (course_lib.grading.proof). A cell that hung or crashed the kernel is replaced by one that raises,
and the notebook is run again, so a hang costs only the cell it hits. Every process a run started
is stopped afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from ..launcher import available_cpus
from . import proof

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Every pytest process now running, so that an interrupted grade.py can stop them all; once it is
# stopping, no new one starts (a batch would otherwise run its notebook again, as after a crash).
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


class GradingStopped(RuntimeError):
    """grade.py is stopping (interrupted): no judge starts any more."""


def kill_tree(proc: subprocess.Popen, known: dict[int, psutil.Process]) -> None:
    """Stop proc and every process it started (also those already re-parented)."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            known.setdefault(child.pid, child)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in known.values():
        with contextlib.suppress(psutil.Error):
            if child.is_running():  # is_running also guards against a reused pid
                child.kill()
    with contextlib.suppress(Exception):
        proc.wait(10)
    psutil.wait_procs(list(known.values()), timeout=5)


def kill_running() -> None:
    """Stop every pytest run now in progress, and the processes each started; start none after."""
    with _running_lock:
        _stopping.set()
        for proc in list(_running):
            kill_tree(proc, {})


def run_pytest(command: list[str], cwd: Path, env: dict, log_path: Path, time_limit: float) -> tuple[bool, list[str]]:
    """Run pytest; return (False if it ran past time_limit and was killed, the verdict lines).

    The verdicts come on a pipe whose write end only pytest holds (course_lib.grading.verdicts).
    """
    known: dict[int, psutil.Process] = {}
    read_end, write_end = os.pipe()
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(os.fdopen(read_end, encoding="utf-8", errors="replace")),
                              daemon=True)
    reader.start()
    with _running_lock:  # started and known at once: kill_running misses no run, and starts none after it
        try:
            if _stopping.is_set():
                raise GradingStopped("grading was interrupted: this notebook is not run")
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(command, cwd=cwd, env=dict(env, COURSE_VERDICT_FD=str(write_end)),
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, pass_fds=(write_end,))
        finally:
            os.close(write_end)  # the reader then ends too
        _running.add(proc)
    finished = False
    try:
        deadline = time.monotonic() + time_limit
        while time.monotonic() < deadline:
            try:
                proc.wait(0.5)
                finished = True
                break
            except subprocess.TimeoutExpired:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        known.setdefault(child.pid, child)
    finally:
        kill_tree(proc, known)  # after a normal exit this stops only what was left behind
        with _running_lock:
            _running.discard(proc)
    reader.join(10)
    return finished, list(lines)


# --------------------------------------------------------------------------
# What a run says: each cell's outcome (verdicts) and exception (records)
# --------------------------------------------------------------------------
@dataclass
class CellOutcome:
    status: str  # passed, failed, xfailed, skipped, missing
    message: str = ""
    seconds: float = 0.0


def read_verdicts(lines: list[str]) -> dict[int, CellOutcome]:
    """nbval's items are named 'Cell N', N counting code cells from 0 (from the verdicts plugin)."""
    outcomes: dict[int, CellOutcome] = {}
    for line in lines:
        try:
            entry = json.loads(line)
            match = re.fullmatch(r"Cell (\d+)", str(entry.get("name", "")))
        except (json.JSONDecodeError, AttributeError):
            continue
        if not match:
            continue
        number = int(match[1])
        # A cell passes only on its call's report: a run stopped for time mid-cell has sent only the
        # setup's, and that cell did not pass (it is "missing", as a cell never reached).
        outcome = outcomes.setdefault(number, CellOutcome("missing"))
        message = ANSI.sub("", str(entry.get("message") or ""))
        if entry.get("when") == "teardown":
            continue
        if entry.get("outcome") == "failed":
            outcome.status, outcome.message = "failed", message
        elif entry.get("outcome") == "skipped":
            outcome.status = "xfailed" if entry.get("xfail") else "skipped"
        elif entry.get("when") == "call" and outcome.status == "missing":
            outcome.status = "passed"
    return outcomes


def read_records(path: Path, code_sources: list[str], secret: str) -> dict[int, dict]:
    """The judge's sealed line for each code cell that ran (course_lib.grading.proof), by cell number.

    Each cell's source is unique in a run (write_attempt numbers them), so a line names its cell
    by the source's hash alone. A line without the judge's seal, or that cannot be read, counts as
    no line at all: that cell did not report back."""
    if not path.exists():
        return {}
    numbers = {proof.cell_key(source): number for number, source in enumerate(code_sources)}
    records = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(entry, dict) and entry.get("cell") in numbers and proof.is_sealed(secret, entry):
            records.setdefault(numbers[entry["cell"]], entry)
    return records


@dataclass
class RunResult:
    outcomes: dict[int, CellOutcome]  # by code cell number
    records: dict[int, dict]  # by code cell number
    replaced: dict[int, str]  # code cell number -> why it was replaced
    problem: str | None = None


# --------------------------------------------------------------------------
# One merged notebook, run as often as it takes to get past every cell that hangs the judge
# --------------------------------------------------------------------------
def write_attempt(merged: nbformat.NotebookNode, replaced: dict[int, str], rundir: Path, secret: str
                  ) -> tuple[Path, list[str]]:
    """Write one run's notebook (the replaced cells raising why), pytest.ini and the judge's seed
    file into rundir; return the notebook's path and its code cells' sources."""
    notebook = nbformat.from_dict(json.loads(json.dumps(merged)))
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for number, why in replaced.items():
        cells[number].source = f"raise RuntimeError({why!r})"
    for number, cell in enumerate(cells):
        # A batch repeats each check's source once per submission: a last line of its own makes every
        # cell's source, and so the hash its record names it by, unique (a comment: nothing changes).
        cell.source = f"{cell.source}\n# the grader's code cell {number}"
    nb_path = rundir / "graded.ipynb"
    nbformat.write(notebook, nb_path)
    (rundir / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    seed_file = rundir / "seed"  # read and deleted by the judge as it starts
    seed_file.write_text(secret)
    seed_file.chmod(0o600)
    return nb_path, [cell.source for cell in cells]


def judge_env(rundir: Path, options) -> dict[str, str]:
    """The environment of one run's pytest, and through it of the judge's kernel."""
    return dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", COURSE_GRADER_RECORD=str(rundir / "records.jsonl"),
                COURSE_GRADING="1", COURSE_GRADING_SEED_FILE=str(rundir / "seed"),
                COURSE_GRADING_SANDBOX="0" if options.no_sandbox else "1", COURSE_GRADING_RUN=options.run_id,
                COURSE_GRADER_CELL_TIMEOUT=str(options.cell_timeout),
                OMP_NUM_THREADS=str(max(1, available_cpus() // options.jobs)), PYTHONDONTWRITEBYTECODE="1",
                # the jobs' ranks share the cores: a waiting OpenMP thread sleeps instead of
                # spinning on a core another job's rank needs (results do not change)
                OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def pytest_command(rundir: Path, nb_path: Path, options, own_cells: list[int]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "nbval.plugin", "-p", "course_lib.grading.verdicts",
            "-p", "course_lib.grading.own_cells", "-c", str(rundir / "pytest.ini"), "--rootdir", str(rundir),
            "--nbval-lax", "--nbval-current-env", f"--nbval-cell-timeout={options.cell_timeout}",
            f"--grader-own-cells={','.join(map(str, own_cells))}",
            f"--grader-own-cell-timeout={options.setup_timeout}", "-q", str(nb_path)]


def cell_to_replace(count: int, outcomes: dict[int, CellOutcome], records: dict[int, dict],
                    replaced: dict[int, str]) -> int | None:
    """The first cell that failed without ever finishing (no record), when later cells were lost
    with it: the kernel hung past the interrupt or died there, and no later cell ran. Else None."""
    def lost(n: int) -> bool:
        return (n not in records and n not in replaced
                and outcomes.get(n, CellOutcome("missing")).status in ("failed", "xfailed", "missing"))

    stuck = next((n for n in range(count) if lost(n)), None)
    if stuck is None or not any(lost(n) for n in range(stuck + 1, count)):
        return None
    return stuck


def run_merged(merged: nbformat.NotebookNode, workdir: Path, options, own_cells: list[int] = ()) -> RunResult:
    """Run a merged notebook; own_cells (the grader's, none of a student's code) run under
    options.setup_timeout, every other cell under options.cell_timeout."""
    code_count = sum(cell.cell_type == "code" for cell in merged.cells)
    replaced: dict[int, str] = {}
    time_limit = (options.cell_timeout * (code_count - len(own_cells) + 1) + options.setup_timeout * len(own_cells)
                  + 120)
    # Each rerun replaces one more cell that never finished, so one rerun per code cell is enough for
    # any number of them: however many cells crash the judge, every other cell of the batch still runs.
    last_attempt = code_count
    for attempt in range(last_attempt + 1):
        if _stopping.is_set():  # interrupted: a judge killed by kill_running is not a crash to run again
            raise GradingStopped("grading was interrupted: this notebook is not run")
        rundir = workdir / f"run{attempt}"
        rundir.mkdir()
        nb_path, sources = write_attempt(merged, replaced, rundir, options.secret)
        # The judge's temporary files (its launch server's socket folder, the sandboxes' folders) in a
        # folder of its own, removed when the run ends: nbval kills the kernel, which cannot clean up.
        judge_tmp = tempfile.mkdtemp(prefix="judge-")  # short: a socket path holds at most 107 bytes
        try:
            in_time, verdict_lines = run_pytest(pytest_command(rundir, nb_path, options, own_cells), rundir,
                                                dict(judge_env(rundir, options), TMPDIR=judge_tmp),
                                                rundir / "pytest.log", time_limit)
        finally:
            shutil.rmtree(judge_tmp, ignore_errors=True)
        outcomes = read_verdicts(verdict_lines)
        records = read_records(rundir / "records.jsonl", sources, options.secret)
        if not in_time:
            return RunResult(outcomes, records, replaced, f"the notebook ran longer than {time_limit:g} s in all")
        if not outcomes:
            return RunResult(outcomes, records, replaced, "the notebook could not be run (the grader's "
                             "kernel did not start); ask your instructor")
        stuck = cell_to_replace(len(sources), outcomes, records, replaced)
        if stuck is None or attempt == last_attempt:
            return RunResult(outcomes, records, replaced)
        # nbval cannot tell these apart: both end in its cell timeout without a reply.
        limit = options.setup_timeout if stuck in own_cells else options.cell_timeout
        replaced[stuck] = (f"this cell did not finish: it ran longer than {limit:g} s and could "
                           "not be interrupted (an infinite loop?), or it crashed the Python kernel")
    raise AssertionError("unreachable")
