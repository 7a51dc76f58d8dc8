"""A classroom on one server: N learners run the same chapter at the same moment.

    python scripts/classroom_load.py [--learners 10] [--notebooks notebooks/01_collectives.ipynb ...]

Each learner is a fresh Jupyter kernel executing a private copy of the notebook top to
bottom (nbclient, as JupyterLab's Run All does), all started together; kernels use local
(IPC) sockets, as in the course's hub (jupyter/jupyterhub_config.py). Reported, measured
in this one run: how many finished with every check passed, the wall time, port clashes
("Address already in use" anywhere in the outputs), processes left behind afterwards, and the
machine's peak memory use above what it used before, per learner, and where it went: the
proportional set size (PSS: each shared page split between the processes sharing it, so the sum
over processes is what they use together) and resident size (RSS) of each kind of process (the
learner's notebook client, the kernel, its launch server, the launched ranks) at the moment
they used the most together. With --tries N the whole run is repeated N times and every try
is reported. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
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

CLASH = "Address already in use"


def one_learner(notebook: str, folder: str, queue) -> None:
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    started = time.perf_counter()
    copy = Path(folder) / Path(notebook).name
    shutil.copy(notebook, copy)
    nb = nbformat.read(copy, as_version=4)
    error = None
    # The kernel talks to its client over local (IPC) sockets, as in the course's hub: with TCP,
    # the ports a kernel is given are free when chosen but can be taken by another learner's
    # ranks before the kernel binds them, and that kernel never starts.
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(folder) / "kernel"))
    try:
        NotebookClient(nb, km=kernel, timeout=900, resources={"metadata": {"path": folder}}).execute()
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


ROLES = ("notebook client", "kernel", "launch server", "ranks", "other")


def _role(command: str, parent: int, servers: set[int]) -> str:
    if parent in servers:  # forked by the launch server: a rank (same command line as its server)
        return "ranks"
    if "ipykernel_launcher" in command:
        return "kernel"
    if "forkserver" in command:
        return "launch server"
    if "multiprocessing.spawn" in command and parent == os.getpid():
        return "notebook client"
    return "other"


def watch_processes(stop: threading.Event, marker: str, breakdown: dict) -> None:
    """Every second, each of the run's processes' PSS, USS and RSS; keeps the sample with the most PSS."""
    while not stop.is_set():
        found = []
        for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
            try:
                if process.pid != os.getpid() and process.environ().get("COURSE_CLASSROOM_RUN") == marker:
                    found.append((process, " ".join(process.info["cmdline"] or []), process.info["ppid"]))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        servers = {process.pid for process, command, _ in found if "forkserver" in command}
        sample = {role: [] for role in ROLES}
        for process, command, parent in found:
            try:
                memory = process.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            sample[_role(command, parent, servers)].append((memory.pss, memory.uss, memory.rss))
        total = sum(values[0] for role in ROLES for values in sample[role])
        if total > breakdown.get("total_pss", -1):
            breakdown.update(total_pss=total, sample=sample)
        stop.wait(1.0)


def print_breakdown(breakdown: dict, learners: int) -> None:
    sample = breakdown.get("sample")
    if not sample:
        return
    print(f"    where the memory went, at the moment the run's processes used the most "
          f"({breakdown['total_pss'] / 2**30:.2f} GiB PSS in all, {breakdown['total_pss'] / 2**30 / learners:.2f} "
          f"GiB a learner); USS: the memory only that process uses")
    print(f"    {'process':<16}{'count':>6}{'PSS, all':>11}{'PSS each':>11}{'USS each':>11}{'RSS each':>11}")
    for role in ROLES:
        values = sample[role]
        if values:
            pss, uss, rss = (sum(v[i] for v in values) / 2**20 for i in range(3))
            n = len(values)
            print(f"    {role:<16}{n:>6}{pss:>9.0f} M{pss / n:>9.0f} M{uss / n:>9.0f} M{rss / n:>9.0f} M")


def run_notebook(notebook: str, learners: int, marker: str) -> dict:
    """All learners run one notebook at once; what happened, and the memory it took."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    time.sleep(3)  # the previous run's processes have exited
    baseline = psutil.virtual_memory().used
    samples: list[int] = []
    breakdown: dict = {}
    stop = threading.Event()
    watchers = [threading.Thread(target=watch_memory, args=(stop, samples), daemon=True),
                threading.Thread(target=watch_processes, args=(stop, marker, breakdown), daemon=True)]
    for watcher in watchers:
        watcher.start()
    with tempfile.TemporaryDirectory(prefix="classroom_") as root:
        processes = []
        for index in range(learners):
            folder = Path(root, f"learner{index:02d}")
            folder.mkdir()
            processes.append(ctx.Process(target=one_learner, args=(str(REPO / notebook), str(folder), queue)))
        started = time.perf_counter()
        for process in processes:
            process.start()
        outcomes = [queue.get(timeout=3600) for _ in processes]
        for process in processes:
            process.join(60)
        wall = time.perf_counter() - started
    stop.set()
    for watcher in watchers:
        watcher.join()
    return {"outcomes": outcomes, "wall": wall, "peak_above_idle": max(samples) - baseline, "breakdown": breakdown}


def leftover_processes(marker: str, patience_s: float = 60.0) -> tuple[int, float, list[psutil.Process]]:
    """The run's processes still alive 5 s after its kernels were told to stop: how many, how long
    until the last of them had exited (waiting up to patience_s), and those still alive then."""
    time.sleep(5)  # give exiting kernels a moment
    lingering = _run_processes(marker)
    count, waited = len(lingering), 5.0
    while lingering and waited < patience_s:
        time.sleep(1)
        waited += 1
        lingering = [p for p in lingering if _alive(p)]
    return count, waited, lingering


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run_processes(marker: str) -> list[psutil.Process]:
    leftovers = []
    ours = {child.pid for child in psutil.Process().children(recursive=True)}  # e.g. our resource tracker
    for process in psutil.process_iter(["pid"]):
        try:
            if process.pid != os.getpid() and process.pid not in ours and process.environ().get("COURSE_CLASSROOM_RUN") == marker:
                leftovers.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return leftovers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=10)
    parser.add_argument("--tries", type=int, default=1, help="repeat the whole run this many times")
    parser.add_argument("--notebooks", nargs="+",
                        default=["notebooks/01_collectives.ipynb", "notebooks/03_ddp.ipynb"])
    options = parser.parse_args()
    # Imported here, not at the top: each learner's process (spawned, so it imports this file)
    # stands for the learner's Jupyter server, which does not load torch.
    from course_lib.launcher import available_cpus

    # As the course's hub does for its learners (jupyter/jupyterhub_config.py): OpenMP threads
    # that wait for work sleep instead of spinning on a core another learner's rank needs.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    print(f"machine: {platform.machine()}, {available_cpus()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}")
    summary = []
    for attempt in range(1, options.tries + 1):
        print(f"try {attempt} of {options.tries}, {options.learners} learners")
        marker = f"{os.getpid()}-{time.time_ns()}"
        os.environ["COURSE_CLASSROOM_RUN"] = marker  # inherited by every kernel and worker we start
        for notebook in options.notebooks:
            run = run_notebook(notebook, options.learners, marker)
            outcomes = run["outcomes"]
            passed = sum(o["error"] is None for o in outcomes)
            clashes = sum(o["clashes"] for o in outcomes)
            times = [o["seconds"] for o in outcomes]
            per_learner = run["peak_above_idle"] / 2**30 / options.learners
            print(f"  {Path(notebook).name}: {passed} of {options.learners} passed, wall {run['wall']:.0f} s "
                  f"(each learner {min(times):.0f}-{max(times):.0f} s, median {statistics.median(times):.0f} s), "
                  f"port clashes {clashes}, peak memory above idle {run['peak_above_idle'] / 2**30:.1f} GiB "
                  f"({per_learner:.2f} GiB a learner)")
            for outcome in outcomes:
                if outcome["error"]:
                    print(f"    failed: {outcome['error']}")
            print_breakdown(run["breakdown"], options.learners)
            summary.append((attempt, Path(notebook).stem, passed, run["wall"], clashes, per_learner))
        lingering, waited, leftovers = leftover_processes(marker)
        exiting = f" ({lingering} still exiting 5 s after the kernels stopped, the last gone after {waited:.0f} s)" \
            if lingering and not leftovers else ""
        print(f"  processes left behind: {len(leftovers)}{exiting}")
        for process in leftovers:
            with contextlib.suppress(psutil.Error):
                print(f"    {process.pid}: {' '.join(process.cmdline())[:120]}")
    print("\n| try | notebook | passed | wall | port clashes | peak memory above idle, a learner |")
    print("|---|---|---|---|---|---|")
    for attempt, name, passed, wall, clashes, per_learner in summary:
        print(f"| {attempt} | {name} | {passed} of {options.learners} | {wall:.0f} s | {clashes} | {per_learner:.2f} GiB |")
    return 0

if __name__ == "__main__":
    sys.exit(main())
