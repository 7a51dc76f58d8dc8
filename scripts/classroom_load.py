"""A classroom on one server: N learners run the same chapter at the same moment.

    python scripts/classroom_load.py [--learners 10] [--notebooks notebooks/01_collectives.ipynb ...]

Each learner is a fresh Jupyter kernel executing a private copy of the notebook top to
bottom (nbclient, as JupyterLab's Run All does), all started together. Reported, measured
in this one run: how many finished with every check passed, the wall time, port clashes
("Address already in use" anywhere in the outputs), processes left behind afterwards, and the
machine's peak memory use above what it used before. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from course_lib.launcher import available_cpus  # noqa: E402

CLASH = "Address already in use"


def one_learner(notebook: str, folder: str, queue) -> None:
    from nbclient import NotebookClient

    started = time.perf_counter()
    copy = Path(folder) / Path(notebook).name
    shutil.copy(notebook, copy)
    nb = nbformat.read(copy, as_version=4)
    error = None
    try:
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": folder}}).execute()
    except Exception as exc:  # noqa: BLE001 - a failing learner is a result, not a crash
        error = _describe(exc, nb)
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                   for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    queue.put({"notebook": Path(notebook).name, "seconds": time.perf_counter() - started,
               "error": error or ("a check failed" if "\u2718" in text else None),
               "clashes": text.count(CLASH)})


def _describe(exc: Exception, nb) -> str:
    """Which cell failed, and the error it raised (its last line)."""
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)
    if ename is None:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    failed = [index for index, cell in enumerate(code, 1)
              if any(output.output_type == "error" for output in cell.get("outputs", []))]
    where = (f"code cell {failed[0]} ({next(iter(code[failed[0] - 1].source.splitlines()), '')[:60]!r})"
             if failed else "a cell")
    return f"{where}: {ename}: {str(evalue).strip()[:400] if evalue else ''}"


def watch_memory(stop: threading.Event, samples: list) -> None:
    while not stop.is_set():
        samples.append(psutil.virtual_memory().used)
        time.sleep(0.25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=10)
    parser.add_argument("--notebooks", nargs="+",
                        default=["notebooks/01_collectives.ipynb", "notebooks/03_ddp.ipynb"])
    options = parser.parse_args()
    print(f"machine: {platform.machine()}, {available_cpus()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}")
    marker = f"{os.getpid()}-{time.time_ns()}"
    os.environ["COURSE_CLASSROOM_RUN"] = marker  # inherited by every kernel and worker we start
    baseline = psutil.virtual_memory().used
    samples: list[int] = []
    stop = threading.Event()
    threading.Thread(target=watch_memory, args=(stop, samples), daemon=True).start()
    ctx = mp.get_context("spawn")
    for notebook in options.notebooks:
        queue = ctx.Queue()
        with tempfile.TemporaryDirectory(prefix="classroom_") as root:
            learners = []
            for index in range(options.learners):
                folder = Path(root, f"learner{index:02d}")
                folder.mkdir()
                learners.append(ctx.Process(target=one_learner, args=(str(REPO / notebook), str(folder), queue)))
            started = time.perf_counter()
            for learner in learners:
                learner.start()
            outcomes = [queue.get(timeout=3600) for _ in learners]
            for learner in learners:
                learner.join(60)
            wall = time.perf_counter() - started
        passed = sum(o["error"] is None for o in outcomes)
        clashes = sum(o["clashes"] for o in outcomes)
        times = [o["seconds"] for o in outcomes]
        print(f"{Path(notebook).name}: {passed} of {options.learners} passed, wall {wall:.0f} s "
              f"(each learner {min(times):.0f}-{max(times):.0f} s, median {statistics.median(times):.0f} s), "
              f"port clashes {clashes}")
        for outcome in outcomes:
            if outcome["error"]:
                print(f"    failed: {outcome['error']}")
    time.sleep(5)  # give exiting kernels a moment
    stop.set()
    leftovers = []
    ours = {child.pid for child in psutil.Process().children(recursive=True)}  # e.g. our resource tracker
    for process in psutil.process_iter(["pid"]):
        try:
            if process.pid != os.getpid() and process.pid not in ours and process.environ().get("COURSE_CLASSROOM_RUN") == marker:
                leftovers.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    print(f"processes left behind: {len(leftovers)}")
    for process in leftovers:
        print(f"    {process.pid}: {' '.join(process.cmdline())[:120]}")
    print(f"peak memory above the idle machine: {(max(samples) - baseline) / 2**30:.1f} GiB "
          f"({(max(samples) - baseline) / 2**30 / options.learners:.2f} GiB per learner)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
