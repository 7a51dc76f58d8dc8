"""A classroom on one server: N learners run the same chapter at the same moment.

    .venv/bin/python scripts/classroom_load.py [--learners 10] [--notebooks notebooks/01_collectives.ipynb ...]
    sudo .venv/bin/python scripts/classroom_load.py --hub [--learners 10] ...   # through the class hub

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

With --hub (as root, after `make hub-deps`), the learners are real ones of the course's hub
(jupyter/jupyterhub_config.py): each logs in through the form, gets a server of their own (their
own user, namespaces and limits), and runs the notebook's cells in a kernel of that server through
the hub's proxy, all at once; the memory then includes the hub, its proxy and every learner's
Jupyter server.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import platform
import secrets
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
    kernel = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(folder) / "kernel"),
                           connection_file=str(Path(folder) / "kernel.json"))  # not a file of its own in /tmp
    # Each learner of a class is a user of their own, with a launch server of their own (one user's kernels
    # share one: course_lib/launcher/shared_server.py); here all run as one user, so each gets a runtime
    # folder of its own (short: a socket's path has at most 107 bytes).
    runtime = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        NotebookClient(nb, km=kernel, timeout=900, resources={"metadata": {"path": folder}}).execute()
    except Exception as exc:  # noqa: BLE001 - a failing learner is a result, not a crash
        error = _describe(exc, nb)
    text = "".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                   for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", []))
    shutil.rmtree(runtime, ignore_errors=True)
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


def watch_processes(stop: threading.Event, marker: str, breakdown: dict, select=None, role_of=None) -> None:
    """Every second, each of the run's processes' PSS, USS and RSS; keeps the sample with the most PSS.
    select(process) says which processes are the run's (default: those with the run's marker)."""
    select = select or (lambda process: process.environ().get("COURSE_CLASSROOM_RUN") == marker)
    role_of = role_of or _role
    roles = breakdown.setdefault("roles", ROLES)
    while not stop.is_set():
        found = []
        for process in psutil.process_iter(["pid", "ppid", "cmdline"]):
            try:
                if process.pid != os.getpid() and select(process):
                    found.append((process, " ".join(process.info["cmdline"] or []), process.info["ppid"]))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        servers = {process.pid for process, command, _ in found if "forkserver" in command}
        sample = {role: [] for role in roles}
        for process, command, parent in found:
            try:
                memory = process.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            sample[role_of(command, parent, servers)].append((memory.pss, memory.uss, memory.rss))
        total = sum(values[0] for role in roles for values in sample[role])
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
    for role in breakdown.get("roles", ROLES):
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



# --------------------------------------------------------------------------
# Through the class hub (--hub)
# --------------------------------------------------------------------------
HUB_ROLES = ("hub and proxy", "jupyter server", "kernel", "launch server", "ranks", "other")


def _hub_role(command: str, parent: int, servers: set[int]) -> str:
    if parent in servers:
        return "ranks"
    if "jupyterhub-singleuser" in command:
        return "jupyter server"
    if "ipykernel_launcher" in command:
        return "kernel"
    if "forkserver" in command:
        return "launch server"
    if "jupyterhub" in command or "configurable-http-proxy" in command:
        return "hub and proxy"
    return "other"


# The Unix users of the measured class: a prefix with a dot, which no roster name can hold (jupyterhub_config.py),
# so the script never makes or removes a real learner's user.
LOAD_PREFIX = "loadtest."
DOMAIN = "hub.localhost"  # every NAME.hub.localhost is this machine (hub_client.names_on_this_machine)


def _of_the_hub(hub_pid: int):
    def select(process: psutil.Process) -> bool:
        if process.username().startswith(LOAD_PREFIX):
            return True
        return process.pid == hub_pid or hub_pid in {parent.pid for parent in process.parents()}
    return select


def through_hub(notebooks: list[str], learners: int) -> list[dict]:
    """One class through the hub: start it, log every learner in, start their servers, run each notebook
    in all of them at once; stop it. For each notebook: the outcomes, the wall time, the memory."""
    from concurrent.futures import ThreadPoolExecutor

    from course_lib.torchrun import free_port

    sys.path.insert(0, str(REPO / "jupyter"))
    from hub_client import (Hub, learner_hub, loopback_certificate, names_on_this_machine, remove_users, run_notebook,
                            start_hub, stop_hub)
    from hub_logins import handed_out

    names = [f"learner{index:02d}" for index in range(learners)]
    homes = Path(tempfile.mkdtemp(prefix="classroom-homes-", dir="/var/tmp"))
    homes.chmod(0o711)
    runs = []
    with tempfile.TemporaryDirectory(prefix="classroom_hub_") as root:
        roster, port, token = Path(root, "roster.txt"), free_port(), secrets.token_hex(32)
        roster.write_text("\n".join(names) + "\n")
        cert, key = loopback_certificate(Path(root))
        state = Path(root, "state")
        env = {"HUB_PORT": str(port), "HUB_IP": "127.0.0.1", "HUB_STATE": str(state), "HUB_API_TOKEN": token,
               "HUB_ROSTER": str(roster), "HUB_HOMES": str(homes), "HUB_SSL_CERT": str(cert),
               "HUB_SSL_KEY": str(key), "HUB_USER_PREFIX": LOAD_PREFIX, "HUB_DOMAIN": DOMAIN}
        remove_users(names, LOAD_PREFIX)
        time.sleep(3)
        baseline = psutil.virtual_memory().used
        process = start_hub(env, Path(root, "hub.log"))
        url = f"https://{DOMAIN}:{port}"
        instructor = Hub(url, token, str(cert))
        resolving = names_on_this_machine(DOMAIN)  # each learner's server on an origin of its own
        resolving.__enter__()  # (left in finally)
        try:
            instructor.wait_until("the hub answers", lambda: instructor.api("GET", "") is not None, 120)
            passwords = handed_out(state)  # made before the hub opened: one per roster name
            hubs = {name: learner_hub(url, name, passwords[name], str(cert)) for name in names}
            for name, hub in hubs.items():
                hub.http.post(f"{url}/hub/api/users/{name}/server", timeout=600).raise_for_status()
            for name, hub in hubs.items():
                hub.wait_until(f"{name}'s server is ready", lambda: (hub.server(name) or {}).get("ready"), 600)
            for notebook in notebooks:
                samples, breakdown, stop = [], {"roles": HUB_ROLES}, threading.Event()
                watchers = [threading.Thread(target=watch_memory, args=(stop, samples), daemon=True),
                            threading.Thread(target=watch_processes, daemon=True,
                                             args=(stop, "", breakdown, _of_the_hub(process.pid), _hub_role))]
                for watcher in watchers:
                    watcher.start()
                started = time.perf_counter()
                with ThreadPoolExecutor(learners) as pool:
                    outcomes = list(pool.map(lambda name: run_notebook(hubs[name], name, REPO / notebook, 900), names))
                wall = time.perf_counter() - started
                stop.set()
                for watcher in watchers:
                    watcher.join()
                runs.append({"notebook": notebook, "wall": wall, "peak_above_idle": max(samples) - baseline,
                             "breakdown": breakdown,
                             "outcomes": [{"seconds": o["seconds"], "clashes": o["clashes"],
                                           "error": o["failure"] or ("a check failed" if o["failed"] else None)}
                                          for o in outcomes]})
        finally:
            resolving.__exit__(None, None, None)
            stop_hub(process)
            time.sleep(5)
            left = [p for p in psutil.process_iter() if _learners_process(p)]
            remove_users(names, LOAD_PREFIX)
            shutil.rmtree(homes, ignore_errors=True)
    for run in runs:
        run["left"] = left
    return runs


def _learners_process(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error, KeyError):
        return process.username().startswith(LOAD_PREFIX)
    return False


def report(run: dict, notebook: str, learners: int) -> tuple:
    """Print one notebook's run; its line of the summary table."""
    outcomes = run["outcomes"]
    passed = sum(o["error"] is None for o in outcomes)
    clashes = sum(o["clashes"] for o in outcomes)
    times = [o["seconds"] for o in outcomes]
    per_learner = run["peak_above_idle"] / 2**30 / learners
    print(f"  {Path(notebook).name}: {passed} of {learners} passed, wall {run['wall']:.0f} s "
          f"(each learner {min(times):.0f}-{max(times):.0f} s, median {statistics.median(times):.0f} s), "
          f"port clashes {clashes}, peak memory above idle {run['peak_above_idle'] / 2**30:.1f} GiB "
          f"({per_learner:.2f} GiB a learner)")
    for outcome in outcomes:
        if outcome["error"]:
            print(f"    failed: {outcome['error']}")
    print_breakdown(run["breakdown"], learners)
    return Path(notebook).stem, passed, run["wall"], clashes, per_learner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=10)
    parser.add_argument("--tries", type=int, default=1, help="repeat the whole run this many times")
    parser.add_argument("--notebooks", nargs="+",
                        default=["notebooks/01_collectives.ipynb", "notebooks/03_ddp.ipynb"])
    parser.add_argument("--hub", action="store_true",
                        help="the learners are real ones of the course's hub (root; make hub-deps first)")
    options = parser.parse_args()
    if options.hub and os.geteuid() != 0:
        parser.error("--hub starts the class hub, which runs as root: sudo .venv/bin/python scripts/classroom_load.py --hub")
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
        print(f"try {attempt} of {options.tries}, {options.learners} learners" + (" through the hub" if options.hub else ""))
        if options.hub:
            runs = through_hub(options.notebooks, options.learners)
            for run in runs:
                summary.append((attempt, *report(run, run["notebook"], options.learners)))
            print(f"  processes of the learners left after the hub stopped: {len(runs[0]['left']) if runs else 0}")
            continue
        marker = f"{os.getpid()}-{time.time_ns()}"
        os.environ["COURSE_CLASSROOM_RUN"] = marker  # inherited by every kernel and worker we start
        for notebook in options.notebooks:
            summary.append((attempt, *report(run_notebook(notebook, options.learners, marker), notebook,
                                             options.learners)))
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
