"""Failures, checkpoints and silent errors, by the numbers.

Introduced in chapter 14 (fault tolerance). Small functions the lesson uses to predict and to count:
the mean time between failures of a cluster, the Young/Daly checkpoint interval, the share of time
lost to checkpoints and redone work, a clock that counts, in steps, what a run with failures costs,
the files a checkpoint wrote, and a checksum that no single flipped bit escapes.
"""

from __future__ import annotations

import math
import os
import random

import torch


def mtbf_hours(interruptions: int, days: float, devices: int) -> tuple[float, float]:
    """(the cluster's, one device's) mean time between failures, in hours, from a failure count.

    A cluster of ``devices`` that fails ``interruptions`` times in ``days`` fails every
    days * 24 / interruptions hours; if every device fails independently at the same rate, one
    device fails ``devices`` times less often.
    """
    cluster = days * 24 / interruptions
    return cluster, cluster * devices


def young_daly_interval(delta: float, mtbf: float) -> float:
    """The checkpoint interval T = sqrt(2 * delta * M) that minimises lost_fraction (same units)."""
    return math.sqrt(2 * delta * mtbf)


def lost_fraction(interval: float, delta: float, mtbf: float) -> float:
    """First-order share of time lost: delta / T writing checkpoints, T / (2M) redoing lost work."""
    return delta / interval + interval / (2 * mtbf)


def expected_goodput(interval: int, delta: int, mtbf: float) -> float:
    """Useful steps per step of clock when each clock step fails with probability 1 / mtbf.

    A segment of T steps and its checkpoint (delta more steps) needs L = T + delta failure-free clock
    steps in a row; with a failed clock step counted and the segment started again, that takes
    (q**-L - 1) / p clock steps on average (p = 1 / mtbf, q = 1 - p). Restarts cost nothing here.
    """
    p = 1 / mtbf
    return interval / (((1 - p) ** -(interval + delta) - 1) / p)


def failure_clock_steps(mtbf: float, horizon: int, seed: int) -> list[int]:
    """The clock steps (1, 2, ...) that fail, each with probability 1 / mtbf: seeded, the same everywhere."""
    rng = random.Random(seed)
    return [t for t in range(1, horizon + 1) if rng.random() < 1 / mtbf]


def run_with_failures(total_steps: int, interval: int, delta: int, failures: list[int]) -> dict:
    """Count what a run costs on a clock where a training step takes 1 and a checkpoint ``delta``.

    A failure in a clock step loses that step and everything since the last checkpoint (a failure
    while writing loses the checkpoint too); the run restarts at once from the last checkpoint.
    Checkpoints are written after every ``interval`` steps, except after the last step.
    Returns the clock at the end, the training steps executed, the failures hit and the restarts'
    starting steps.
    """
    failing, clock, executed, saved, step, restarts = set(failures), 0, 0, 0, 0, []
    while step < total_steps:
        clock += 1
        if clock in failing:
            step = saved
            restarts.append(saved)
            continue
        step += 1
        executed += 1
        if step % interval == 0 and step < total_steps:
            hit = [t for t in range(clock + 1, clock + delta + 1) if t in failing]
            if hit:
                clock = hit[0]
                step = saved
                restarts.append(saved)
                continue
            clock += delta
            saved = step
    return {"clock": clock, "executed": executed, "failures": len(restarts), "restarts": restarts}


def checkpoint_files(path) -> list[tuple[str, int]]:
    """(name, bytes) of every file under ``path``, sorted by name."""
    return sorted((os.path.relpath(os.path.join(root, name), path), os.path.getsize(os.path.join(root, name)))
                  for root, _, names in os.walk(path) for name in names)


def bits_checksum(tensors) -> int:
    """The sum of the float64 tensors' bit patterns read as 64-bit integers (wrapping).

    Flipping one bit adds or subtracts a power of two below 2**64, so the sum always changes;
    a floating-point sum of the values can round such a change away.
    """
    total = torch.zeros((), dtype=torch.int64)
    for tensor in tensors:
        if tensor.dtype != torch.float64:
            raise TypeError(f"bits_checksum reads float64 tensors, got {tensor.dtype}")
        total = total + tensor.detach().contiguous().view(torch.int64).sum()
    return int(total)


def flip_bit(tensor: torch.Tensor, index: int, bit: int) -> None:
    """Flip one bit (0 = the lowest of the mantissa) of element ``index`` of a float64 tensor, in place."""
    with torch.no_grad():
        bits = tensor.view(-1).view(torch.int64)
        bits[index] = bits[index] ^ (1 << bit)


def plot_goodput(intervals, predicted, first_order, simulated, measured, *, delta, mtbf, ax=None):
    """Goodput against the checkpoint interval: the formulas as lines, the counted runs as points."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.2), dpi=80)
    ax.plot(intervals, predicted, label="expected (failure per step 1/M)")
    ax.plot(intervals, first_order, "--", label="first order: 1 - δ/T - T/(2M)")
    ax.plot(*zip(*simulated), "o", ms=4, label="clock model, mean of many seeds")
    ax.plot(*zip(*measured), "s", ms=8, mfc="none", mew=2, label="real run on 2 ranks (one seed)")
    ax.axvline(young_daly_interval(delta, mtbf), color="grey", lw=0.8)
    ax.set(xlabel="checkpoint interval T (steps)", ylabel="goodput (useful / clock steps)",
           title=f"δ = {delta} steps, M = {mtbf:g} steps; grey: √(2δM)")
    ax.set_ylim(0.0, 1.0)
    ax.legend(fontsize=8, loc="lower center")
    return ax


# --- torchft: replica groups that train through a failure (chapter 14, section 3) ---------------------

# What torch 2.15 and torchft write to stderr on a healthy run: the gloo group that torchft makes for
# each new quorum calls a setter that torch now deprecates, the HTTP server that sends a live
# checkpoint to a healing peer logs each request, and the receiving side's torch warns about the
# read-only buffer it loads from. Counted by kind; every other line is kept as it is.
KNOWN_STDERR = {
    "torch: setSequenceNumberForGroup() is deprecated (one per new gloo group)": "setSequenceNumberForGroup()",
    "torchft: an HTTP request for a live checkpoint (one per healing peer)": '"GET /checkpoint/',
    "torch: buffer is not writable (when loading a checkpoint received)": "The given buffer is not writable",
    "torch: the source line that warning quotes": "storage = torch.frombuffer(",
}


def torchft_available() -> tuple[bool, str]:
    """(True, version) where torchft imports; else (False, why): the reason a section skips."""
    try:
        import torchft  # noqa: F401
        from importlib.metadata import version
        return True, version("torchft")
    except ImportError as error:
        import platform
        return False, (f"torchft is not installed ({error}); PyPI has wheels for Linux x86_64 only, this is "
                       f"{platform.system()} {platform.machine()} (make setup installs it where one exists)")


def sort_stderr(text: str) -> tuple[dict[str, int], list[str], list[str]]:
    """Sort a replica's stderr: (counts of the KNOWN_STDERR kinds, torchft's error reports, other lines).

    An error report is a line torchft's Python logger starts with "[replica_..." (a collective that
    failed because a peer died, say), with the traceback that follows it; its first line is kept.
    """
    counts, reports, others, in_report = {kind: 0 for kind in KNOWN_STDERR}, [], [], False
    for line in text.splitlines():
        kind = next((k for k, marker in KNOWN_STDERR.items() if marker in line), None)
        if kind is not None:
            counts[kind] += 1
            in_report = False
        elif line.startswith("[replica_"):
            reports.append(line)
            in_report = True
        elif in_report and (line.startswith((" ", "Traceback", "During handling")) or not line.strip()
                            or line.split(":")[0].isidentifier()):
            continue  # the report's traceback, down to its exception line
        elif line.strip():
            others.append(line)
            in_report = False
    return counts, reports, others


def _incarnation(train, replica_id, lighthouse, steps, stderr_path, conn, go):
    """A replica group's process: its stdout and stderr into a file, each record sent to its slot."""
    import ctypes
    import pickle
    import signal
    import traceback

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: ends with its slot, whatever happens
    out = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    torch.set_num_threads(1)
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's Rust side logs every quorum at INFO otherwise

    def send(kind, message):  # plain pickle: tensors travel by value, not as shared memory of a dying process
        conn.send_bytes(pickle.dumps((kind, message)))

    def report(record):  # waits for the slot's answer: a replica to be killed dies here, between two steps
        send("ready" if record == "ready" else "record", None if record == "ready" else record)
        go.recv()

    code = 0
    try:
        train(replica_id, lighthouse, steps, report)
        send("done", None)
    except BaseException:  # noqa: BLE001 - sent to the slot, which raises it in the notebook
        send("error", traceback.format_exc())
        code = 1
    finally:
        conn.close()
        os._exit(code)  # not through torchft's exit handlers: the replica's last step is already reported


def _mark(folder, name, text=""):
    """Write a mark file whole: a reader sees it complete or not at all.

    Several slots may write the same mark at once ("finished": each slot that ends checks whether it
    was the last, and two can both see every slot done), so each writes through a file of its own.
    """
    path = os.path.join(folder, name)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)


def _read_mark(folder, name):
    try:
        with open(os.path.join(folder, name)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def _waiting_at(lighthouse: str) -> int:
    """How many replica groups wait at the lighthouse for a quorum (read from its status page: "not
    ready, only have N participants", or "valid quorum with N participants, waiting for stragglers")."""
    import re
    import urllib.request

    port = lighthouse.rsplit(":", 1)[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as page:
        found = re.search(r"(?:only have|Valid quorum with) (\d+) participants", page.read().decode())
    return int(found.group(1)) if found else 0


def _came_back(folder, lighthouse, replica) -> bool:
    """Whether the returning process of ``replica`` waits at the lighthouse for its first quorum. The
    first replica to see it says so in a mark for the others: once a second replica asks too, the page
    reads differently, and a replica kept off the CPU meanwhile would wait for a sight that has passed."""
    if _read_mark(folder, f"back.{replica}") is not None:
        return True
    if _read_mark(folder, f"ready.{replica}.1") is None or _waiting_at(lighthouse) == 0:
        return False
    _mark(folder, f"back.{replica}")
    return True


def _wait_for(condition, deadline, what):
    import time

    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited too long for {what}")
        time.sleep(0.01)


def _lighthouse_slot(folder, deadline, options):
    """The last launch rank: torchft's lighthouse, its log (Rust, on stderr) into a file."""
    from torchft.coordination import LighthouseServer

    log_path = os.path.join(folder, "lighthouse.log")
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 2)
    lighthouse = LighthouseServer(bind="127.0.0.1:0", **options)
    address = lighthouse.address()
    try:
        _mark(folder, "lighthouse", address)
        _wait_for(lambda: _read_mark(folder, "finished") is not None, deadline, "the replicas to finish")
    finally:
        lighthouse.shutdown()
    with open(log_path) as f:
        log = f.read()
    return {"address": address, "quorum_changes": log.count("Detected quorum change"),
            "log_lines": len(log.splitlines())}


def _replica_slot(train, replicas, steps, folder, kill, timeout, lighthouse_options):
    """One launch rank: runs its replica group in a child process, kills and restarts it if told to."""
    import multiprocessing as mp
    import pickle
    import signal
    import time

    rank, deadline = int(os.environ["RANK"]), time.monotonic() + timeout
    if rank == replicas:
        return _lighthouse_slot(folder, deadline, lighthouse_options)
    try:
        _wait_for(lambda: _read_mark(folder, "lighthouse") is not None, deadline, "the lighthouse")
        lighthouse = _read_mark(folder, "lighthouse")
        ctx = mp.get_context("fork")  # the rank was started clean by the launcher: nothing unsafe to inherit
        incarnations = []
        others = [r for r in range(replicas) if r != rank]

        def run_one(kill_at_step=None):
            stderr_path = os.path.join(folder, f"stderr.{rank}.{len(incarnations)}")
            receive, send = ctx.Pipe(duplex=False)
            go_receive, go_send = ctx.Pipe(duplex=False)
            child = ctx.Process(target=_incarnation,
                                args=(train, rank, lighthouse, steps, stderr_path, send, go_receive))
            child.start()
            send.close()
            go_receive.close()
            records, ended = [], "killed"
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"replica {rank} did not finish within {timeout} s")
                    if not receive.poll(min(left, 0.5)):
                        continue
                    try:
                        kind, message = pickle.loads(receive.recv_bytes())
                    except EOFError:
                        raise RuntimeError(f"replica {rank}'s process died (exit code {child.exitcode})") from None
                    if kind == "ready":
                        _mark(folder, f"ready.{rank}.{len(incarnations)}")
                        if not incarnations:  # the first processes wait for each other; a returning one does not
                            _wait_for(lambda: all(_read_mark(folder, f"ready.{r}.0") is not None for r in others),
                                      deadline, "the other replicas to start")
                        go_send.send(True)
                    elif kind == "done":
                        ended = "finished"
                        break
                    elif kind == "error":
                        raise RuntimeError(f"replica {rank} raised:\n{message}")
                    else:
                        records.append(message)
                        _mark(folder, f"progress.{rank}", str(message["step"]))
                        if kill_at_step is not None and message["step"] >= kill_at_step:
                            os.kill(child.pid, signal.SIGKILL)  # as a machine dies: no goodbye to anyone
                            break
                        if kill is not None and rank != kill["replica"] and message["step"] == steps - 1:
                            # Not the last step before the returning process waits at the lighthouse, so that
                            # it rejoins before the end: a quorum of the same members as the last one forms
                            # at once ("fast quorum"), without a newcomer whose request is not in yet.
                            _wait_for(lambda: _came_back(folder, lighthouse, kill["replica"]),
                                      deadline, f"replica {kill['replica']} to come back")
                        go_send.send(True)
            finally:
                if child.is_alive() and ended != "finished":
                    os.kill(child.pid, signal.SIGKILL)
                child.join(10)
                receive.close()
                go_send.close()
                with open(stderr_path) as f:
                    stderr = f.read()
                incarnations.append({"records": records, "ended": ended, "exitcode": child.exitcode,
                                     "stderr": stderr})

        if kill is not None and rank == kill["replica"]:
            run_one(kill_at_step=kill["at_step"])
            back_at = kill["at_step"] + kill["down_steps"]
            _wait_for(lambda: all(int(_read_mark(folder, f"progress.{r}") or 0) >= back_at for r in others),
                      deadline, f"the other replicas to reach step {back_at}")
            run_one()
        else:
            run_one()
        return incarnations
    finally:
        _mark(folder, f"slot_done.{rank}")
        if all(_read_mark(folder, f"slot_done.{r}") is not None for r in range(replicas)):
            _mark(folder, "finished")


def run_replica_groups(train, replicas: int, steps: int, *, kill: dict | None = None, timeout: float = 120,
                       join_timeout_ms: int = 60_000, heartbeat_timeout_ms: int = 5_000):
    """Run ``train`` as ``replicas`` torchft replica groups around one lighthouse; return what each did.

    ``train(replica_id, lighthouse_address, steps, report)`` trains one replica group (one process
    here): it calls ``report("ready")`` once its torchft Manager exists (the first processes then
    start together) and ``report(record)`` after each step, with a dict holding at least "step".
    Each replica group runs in a child of one rank of ``course_lib.launch``, so it ends with it; one
    more rank runs the lighthouse (torchft's ``LighthouseServer``, on a free port of 127.0.0.1).
    ``kill={"replica": r, "at_step": s, "down_steps": d}`` SIGKILLs replica r's process once it
    reports step s (before it starts another), and starts a fresh one when every other replica has reported
    step s + d; the others do not start their last step before that process waits at the lighthouse for
    its first quorum, so it rejoins before the end, however slowly it starts.
    The lighthouse's timeouts are torchft's own defaults: a quorum forms once every replica that still
    heartbeats has asked (a dead one stops counting ``heartbeat_timeout_ms`` after its last heartbeat),
    or ``join_timeout_ms`` after the first asked. With a 1 s join timeout and 2 s heartbeats, a machine
    busy enough to keep one replica off the CPU for a second let a quorum form without it (the returning
    replica and one other), and the third then waited to the end of the run for a newcomer already gone.
    Returns (per replica, the list of its processes' {"records", "ended", "exitcode", "stderr"};
    the lighthouse's {"address", "quorum_changes", "log_lines"}). Every process has ended when it returns, also after an error.
    """
    import shutil
    import tempfile

    from .launcher import launch

    folder = tempfile.mkdtemp(prefix="course_torchft_")
    options = {"min_replicas": 1, "join_timeout_ms": join_timeout_ms, "heartbeat_timeout_ms": heartbeat_timeout_ms}
    try:
        results = launch(_replica_slot, replicas + 1,
                         args=(train, replicas, steps, folder, kill, timeout, options),
                         init_process_group=False, show_output=False, timeout=timeout + 30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return results[:replicas], results[replicas]
