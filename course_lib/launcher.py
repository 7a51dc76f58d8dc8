"""Run one function on N real ``torch.distributed`` worker processes.

Defined in chapter 00 (preflight), used by every chapter after it::

    from course_lib import launch
    results = launch(fn, world_size=4, args=(x, y), timeout=60)

Each worker is a real operating-system process with the default process group
initialised (gloo for CPU tensors; on a machine with a GPU per rank also NCCL for
CUDA tensors) and the torchrun environment variables a function needs (RANK,
LOCAL_RANK, WORLD_SIZE, ...). What the parent process does, in order:

1. reserve a free port the operating system picks and hold it for the whole
   launch, so concurrent launches never fight over a port (rank 0 hosts the
   rendezvous store on it, as with ``torchrun``);
2. start the workers (how, and why, below) with ``fn`` sent by value
   (cloudpickle), so functions defined in a notebook cell work;
3. wait for each rank's result, a failing rank, a dead rank or the timeout;
4. on any failure stop every worker (and the workers' own children);
5. print each rank's output in rank order, prefixed ``[rank r]``.

How workers start, and why
--------------------------
A worker forked straight from the notebook kernel inherits the kernel's OpenMP
thread pool, and GNU OpenMP's pool does not survive ``fork``: once the kernel has
run any multi-threaded tensor op, a forked worker that uses more than one
intra-op thread hangs in its first parallel op (pytorch#41197, #58962). A 2-core
machine never sees it (2 ranks get one thread each); a 4-core laptop always does.
``spawn`` avoids it but starts a fresh interpreter per rank per launch (about 5 s
for 4 ranks on 2 cores, 14 s from a notebook). So, on Linux, workers are forked
from a *launch server*: a fresh interpreter started once per kernel (Python's
``forkserver``) that imports torch and never runs a tensor op or touches CUDA.
Its children start in milliseconds with torch already imported, may use as many
threads as they like, and may use CUDA even when the kernel already has.

Because a server child does not inherit the kernel's memory, the launch sends
what a learner expects a worker to see: ``fn`` and its arguments by value, the
kernel's environment variables *at the moment of the launch* (e.g.
``TORCH_DISTRIBUTED_DEBUG`` set in a cell), its working directory and
``sys.path``. Variables that torch reads only when it is imported (such as
``TORCH_CPP_LOG_LEVEL``) restart the server when they change.

The server starts in the background as soon as the kernel starts (``make`` installs a kernel
setting that calls ``warm_up()``), or else when course_lib is imported: measured on 2 cores,
a learner's first launch then takes about 0.9 s instead of 2.1 s, and later ones 0.15 s.

macOS and Windows use ``spawn`` (Python's own default there: system libraries
are not fork-safe); ``COURSE_START_METHOD=spawn`` forces it anywhere, which the
test suite uses to check that a notebook reads the same on every platform.

Timeouts
--------
``timeout`` is the time ``fn`` may run, counted from the moment every rank has
entered it; starting the ranks (interpreters, imports, rendezvous) is bounded
separately by ``startup_timeout``. So a hang demo can use a 3-second timeout on
every start method. Neither counts the time the ranks were ready to run but waited
for a CPU (Linux: /proc/PID/schedstat), up to ``_MAX_STRETCH`` times the timeout: on
a server shared by a class, where each rank gets a fraction of a core, a launch is
slow but does not time out, while a hang (ranks asleep in a collective, or spinning
with a core to themselves) is reported as soon as on an idle machine.
Launches run by the grader (course_lib.grading) keep the plain rule: a grading run
bounds each cell by wall time and sets its own number of jobs.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import faulthandler
import io
import json
import linecache
import multiprocessing as mp
import os
import re
import select
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
import warnings
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait as wait_for_any

import cloudpickle

__all__ = [
    "launch",
    "LaunchError",
    "WorkerError",
    "WorkerTimeout",
    "UnsendableResult",
    "available_cpus",
    "threads_per_rank",
    "choose_backend",
    "rank_device",
    "report_progress",
    "warm_up",
]

_RESULT_OK = "ok"
_RESULT_ERROR = "error"
_RESULT_UNSENDABLE = "unsendable"
_RESULT_STARTED = "started"
_RESULT_BASELINE = "baseline"  # judged: what the worker had written before any learner code ran
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # absent on Windows
_LIVE_REFRESH_S = 0.5
# A quick run's bars would flash for a fraction of a second (and a busy browser might never
# draw them): once shown, they stay at least this long, at their final values.
_BARS_SHOWN_AT_LEAST_S = 1.5
# What the launch server imports once, so that its children start warm. torch._dynamo
# is what DDP imports on first use: 2.5 s per worker on 2 cores if every worker pays it.
_SERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "course_lib.launcher"]
# Read by torch (or its C++ core) only at import: a change needs a fresh server.
_IMPORT_TIME_VARIABLES = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS",
                          "OMP_WAIT_POLICY", "KMP_AFFINITY", "GOMP_SPINCOUNT")
_PROGRESS_FILE_VARIABLE = "COURSE_PROGRESS_FILE"
# Test-only (tests/test_devices.py), never for learners: COURSE_FAKE_DEVICE=meta makes rank_device()
# act as on a machine with one GPU, with the meta device standing in for it: a process alone on
# its node (the notebook kernel, a one-rank launch) gets `meta`, the ranks of a bigger launch the
# CPU. A tensor on rank_device() that meets one left on the CPU then fails as it would on the GPU
# ("... is not on the expected device ..."), on a machine without one. Nothing else changes:
# choose_backend still gives gloo, which cannot carry meta tensors.
_FAKE_DEVICE_VARIABLE = "COURSE_FAKE_DEVICE"
# Set in every rank of a launch: launch shows each rank all of the GPUs the notebook sees, so one
# visible GPU there is the notebook's, shared by every rank (a session that exported
# CUDA_VISIBLE_DEVICES=0), never a GPU of the rank's own.
_SEES_ALL_GPUS_VARIABLE = "COURSE_RANK_SEES_ALL_GPUS"
# A timeout stretches (by the ranks' wait for a CPU) to at most this many times itself.
_MAX_STRETCH = 10


# --------------------------------------------------------------------------
# Errors the notebook sees
# --------------------------------------------------------------------------
class LaunchError(RuntimeError):
    """A launch did not finish: the message says which rank and why."""


class WorkerError(LaunchError):
    """One rank raised (or died). ``rank``, ``exc_type`` and ``remote_traceback`` say how."""

    def __init__(self, rank, exc_type, message, remote_traceback, world_size, also_failed=()):
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.world_size = world_size
        self.also_failed = list(also_failed)  # other ranks' failures seen with this one (WorkerErrors)
        others = world_size - 1 - len(self.also_failed)
        stopped = f"\nThe other {others} rank{'s were' if others != 1 else ' was'} stopped." if others else ""
        super().__init__(self._report(stopped))

    def _report(self, the_rest: str) -> str:
        also = "".join(f"\nRank {other.rank} failed too, with {other.exc_type}: {_first_line(other.message)}"
                       for other in self.also_failed)
        return (f"rank {self.rank} failed with {self.exc_type}: {self.message}\n"
                f"{self.remote_traceback.rstrip()}{also}{the_rest}")

    def with_every_rank(self, finished, also_failed=()) -> "WorkerError":
        """The report with a line for every other rank: the error it raised too, that it had
        finished (returned its result), or that it was stopped."""
        self.also_failed = sorted([*self.also_failed, *also_failed], key=lambda other: other.rank)
        failed = {self.rank} | {other.rank for other in self.also_failed}
        lines = [f"\nRank {rank} had finished." if rank in finished else f"\nRank {rank} was stopped."
                 for rank in range(self.world_size) if rank not in failed]
        left = sorted(set(finished) - failed)
        if left and "connectFullMesh" in self.message and _lost_a_peer(self):
            # gloo blames "a remote worker crashing"; here a peer had returned, having left the group
            lines.append(f"\nRank(s) {', '.join(map(str, left))} had finished while rank {self.rank} was still "
                         "connecting to the group: a rank that calls destroy_process_group right after "
                         "init_process_group, with no collective in between, closes connections its peers are "
                         "still setting up. Call dist.barrier() before dist.destroy_process_group().")
        self.args = (self._report("".join(lines)),)
        return self


def _first_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


# What gloo and the store raise on a rank whose peer went away: that rank is a victim, not the cause.
_LOST_PEER = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|remote worker", re.IGNORECASE)


def _lost_a_peer(error: WorkerError) -> bool:
    return error.exc_type != "ProcessDied" and bool(_LOST_PEER.search(error.message))


def _root_cause(failures: list[WorkerError], world_size: int) -> WorkerError:
    """Of the ranks that failed together, the one to blame: a rank that died, else one whose error
    is not a lost connection, else the first. The others are listed with it."""
    died = [f for f in failures if f.exc_type == "ProcessDied"]
    own = [f for f in failures if not _lost_a_peer(f)]
    cause = (died or own or failures)[0]
    if len(failures) == 1:
        return cause
    rest = sorted((f for f in failures if f is not cause), key=lambda f: f.rank)
    return type(cause)(cause.rank, cause.exc_type, cause.message, cause.remote_traceback, world_size,
                       also_failed=rest)


class UnsendableResult(WorkerError, TypeError):
    """A rank's return value could not be pickled back to the notebook."""


@dataclass
class RankWhereabouts:
    """Where one rank was when a launch timed out (see ``WorkerTimeout.where``)."""

    rank: int
    state: str  # "finished", "collective", "waiting", "computing", "starting", "unknown"
    collective: str | None = None  # e.g. "all_reduce" when state == "collective"
    frames: list[str] = field(default_factory=list)  # outermost first

    def summary(self) -> str:
        here = f" at {self.frames[-1]}" if self.frames else ""
        user = _innermost_user_frame(self.frames)
        called_from = f" (called from {user})" if user and user != (self.frames or [None])[-1] else ""
        return {
            "finished": f"rank {self.rank}: finished fn, waiting for the other ranks",
            "collective": f"rank {self.rank}: inside the collective {self.collective}{called_from}",
            "waiting": f"rank {self.rank}: waiting for an asynchronous send/recv or collective "
                       f"(work.wait()){here}",
            "computing": f"rank {self.rank}: in its own computation, not in any collective{here}",
            "starting": f"rank {self.rank}: still starting (had not entered fn){here}",
            "unknown": f"rank {self.rank}: no stack available",
        }[self.state]


class WorkerTimeout(LaunchError):
    """The launch ran past its timeout.

    ``stacks[rank]`` is each unfinished rank's Python stack (outermost first),
    ``where[rank]`` says whether it was inside a collective (and which), waiting
    on an asynchronous operation, or in its own computation, and ``finished`` is
    the set of ranks that had returned from fn.
    """

    def __init__(self, timeout, stacks, finished, world_size, phase="fn", waited_s=0.0):
        self.timeout = timeout
        self.waited_s = waited_s  # what the ranks waited for a CPU, not counted in the timeout
        self.stacks = stacks
        self.finished = finished
        self.phase = phase
        self.where = {rank: _classify(rank, stacks.get(rank), rank in finished, phase)
                      for rank in range(world_size)}
        if phase == "startup":
            head = (f"the ranks did not all start within {timeout:g} s "
                    f"({len(finished)} of {world_size} had entered fn). Where each rank was:")
        else:
            head = (f"timed out after {timeout:g} s with {len(finished)} of {world_size} ranks "
                    "finished. Where each rank was:")
        lines = [head]
        for rank in range(world_size):
            lines.append(self.where[rank].summary())
            if rank not in finished:
                lines.extend(f"    {frame}" for frame in stacks.get(rank, ["(no stack available)"]))
        lines.append(_diagnosis(self.where, phase))
        if waited_s >= 1:
            lines.append(f"The ranks also waited {waited_s:.0f} s for a CPU (ready to run, every core busy), which "
                         "the timeout does not count: this machine runs more processes than it has cores. On a "
                         "shared server (a class) raise timeout= or run fewer ranks; otherwise look for what "
                         "else is running.")
        super().__init__("\n".join(lines))


_COLLECTIVE_WRAPPERS = {"wrapper", "_wrapper", "inner", "__call__"}


def _innermost_user_frame(frames):
    for frame in reversed(frames or []):
        if frame.startswith(("Cell In[", "File ")):
            return frame
    return None


def _classify(rank, frames, finished, phase) -> RankWhereabouts:
    if finished:
        return RankWhereabouts(rank, "finished")
    if frames is None:
        return RankWhereabouts(rank, "unknown")
    if phase == "startup" and not any(f.startswith(("Cell In[", "File ")) for f in frames):
        return RankWhereabouts(rank, "starting", frames=frames)
    for frame in reversed(frames):  # innermost first
        match = re.match(r"torch/distributed/[\w/]+\.py in (\w+)$", frame)
        if match and match.group(1) not in _COLLECTIVE_WRAPPERS and not match.group(1).startswith("_"):
            return RankWhereabouts(rank, "collective", collective=match.group(1), frames=frames)
    if frames and ".wait(" in frames[-1]:
        return RankWhereabouts(rank, "waiting", frames=frames)
    return RankWhereabouts(rank, "computing", frames=frames)


def _diagnosis(where, phase) -> str:
    stuck = [w for w in where.values() if w.state not in ("finished",)]
    in_comm = [w for w in stuck if w.state in ("collective", "waiting")]
    computing = [w for w in stuck if w.state == "computing"]
    names = lambda ws: ", ".join(str(w.rank) for w in ws)  # noqa: E731
    if phase == "startup":
        return ("All ranks were stopped. A rank that never reaches fn is usually stuck in the rendezvous "
                "(init_process_group waits for every rank) or in a slow import; raise startup_timeout on "
                "a slow or busy machine.")
    if not in_comm:
        return ("All ranks were stopped. No rank was inside a collective: they were stuck (or just slow) in "
                "their own computation. Likely causes: the work needs more than the timeout (raise "
                "timeout=), an endless loop, or a deadlock in a thread pool (e.g. a worker forked with "
                "start_method='fork' after the notebook ran a multi-threaded op).")
    collectives = {w.collective for w in in_comm if w.state == "collective"}
    if computing or any(w.state == "finished" for w in where.values()):
        others = [w for w in where.values() if w.state != "collective" and w.state != "waiting"]
        return (f"All ranks were stopped. Rank(s) {names(in_comm)} wait in communication that rank(s) "
                f"{names(others)} never joined: every rank of the group must call each collective, in the "
                "same order.")
    if len(collectives) > 1:
        return (f"All ranks were stopped. The ranks are inside different collectives "
                f"({', '.join(sorted(collectives))}): they call collectives in different orders.")
    return ("All ranks were stopped. Every rank is inside communication but it never completes: a send "
            "without a matching recv, a collective called a different number of times per rank, or "
            "mismatched shapes (TORCH_DISTRIBUTED_DEBUG=DETAIL checks them).")


# --------------------------------------------------------------------------
# Small facts the launcher (and the preflight chapter) need
# --------------------------------------------------------------------------
def available_cpus() -> int:
    """CPU cores this process may use (respects taskset, cgroups via affinity).

    ``COURSE_CPUS=8`` makes the course behave as on an 8-core machine (the test
    suite uses it so the many-core code paths run on a small CI machine too).
    """
    pretend = os.environ.get("COURSE_CPUS")
    if pretend:
        if not pretend.isdigit() or int(pretend) < 1:
            raise ValueError(f"COURSE_CPUS must be a positive whole number of cores, got {pretend!r}")
        return int(pretend)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads per rank so that N ranks together don't oversubscribe the cores."""
    return max(1, available_cpus() // world_size)


def choose_backend(world_size: int) -> str:
    """gloo for CPU tensors; with a GPU per rank, also NCCL for CUDA tensors.

    The per-device form ``"cpu:gloo,cuda:nccl"`` lets the same cell run on a laptop
    and on a GPU machine: chapters build CPU tensors, which an NCCL-only group rejects.
    """
    import torch.distributed as dist

    if _visible_gpus() >= world_size and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _visible_gpus() -> int:
    """The GPUs this process sees (0 without CUDA): what choose_backend, rank_gpu and a launch's
    placement line count."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_gpu():
    """This rank's GPU index, or None when the rank has no GPU of its own (the CPU and gloo).

    A launcher gives each rank its GPU in one of two ways: every rank sees all of the node's
    GPUs and takes ``cuda:LOCAL_RANK`` (``launch``, torchrun's default), or each rank sees only
    its own, as ``cuda:0`` (CUDA_VISIBLE_DEVICES set per rank: ``srun --gpus-per-task=1``,
    ``torchrun --virtual-local-rank``). The script ``write_torchrun_script`` writes applies the
    same rule (a test holds the two together). ``launch`` always shows every rank all of the
    notebook's GPUs, so in its ranks one visible GPU is shared (CUDA_VISIBLE_DEVICES=0 exported
    for the whole session): the ranks of a bigger launch stay on the CPU. Under torchrun the two
    look the same to a rank: there, export no single GPU for several processes on one node.
    """
    visible = _visible_gpus()
    if visible == 0:
        return None
    if visible >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")):  # all of the node's GPUs
        return int(os.environ.get("LOCAL_RANK", "0"))
    if visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES") and not os.environ.get(_SEES_ALL_GPUS_VARIABLE):
        return 0  # this rank's own GPU only
    return None  # fewer GPUs than ranks, all visible to all: the ranks would have to share them


def rank_device():
    """This rank's device: its own GPU (see ``rank_gpu``) when it has one, else the CPU.

    Chapters create tensors and models with ``.to(rank_device())`` so the same cell runs
    with gloo on a laptop and with NCCL on a GPU machine, under ``launch`` and under torchrun.
    """
    import torch

    stand_in = os.environ.get(_FAKE_DEVICE_VARIABLE)
    if stand_in:  # test-only: see _FAKE_DEVICE_VARIABLE
        alone = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) == 1
        return torch.device(stand_in) if alone else torch.device("cpu")
    gpu = rank_gpu()
    return torch.device("cpu") if gpu is None else torch.device("cuda", gpu)


def report_progress(step: int, total: int) -> None:
    """From inside fn: "this rank has done ``step`` of ``total``" (drawn as a live progress bar).

    Outside a launch it does nothing, so the same function also runs under torchrun.
    """
    path = os.environ.get(_PROGRESS_FILE_VARIABLE)
    if not path:
        return
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as f:
            f.write(f"{int(step)} {int(total)}")
        os.replace(path + ".tmp", path)


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _default_start_method() -> str:
    methods = mp.get_all_start_methods()
    # macOS: system libraries are not fork-safe, so Python defaults to spawn there too.
    if "forkserver" in methods and sys.platform != "darwin":
        return "forkserver"
    return "spawn"


def _choose_start_method(requested, threads):
    if requested is None:  # COURSE_START_METHOD=spawn runs a whole notebook as macOS would
        requested = os.environ.get("COURSE_START_METHOD") or None
    if requested not in (None, "fork", "forkserver", "spawn"):
        raise ValueError("start_method must be 'forkserver', 'spawn', 'fork' or None (choose for me), "
                         f"not {requested!r}")
    if requested is None:
        return _default_start_method()
    if requested not in mp.get_all_start_methods():
        raise ValueError(f"start_method={requested!r} is not available on this platform; use 'spawn'.")
    if requested == "fork":
        if _cuda_initialised():
            raise ValueError(
                "CUDA is already initialised in this process, and a forked worker cannot use it "
                "(the CUDA driver does not survive fork). Fix: leave start_method unset (the default "
                "starts workers from a clean server process) or pass start_method='spawn'."
            )
        if threads > 1:
            raise ValueError(
                f"start_method='fork' with threads={threads} can hang: a worker forked from a process "
                "that has run a multi-threaded tensor op deadlocks in its first parallel op (OpenMP's "
                "thread pool does not survive fork). Fix: leave start_method unset (the default is "
                "safe), or pass threads=1 with fork."
            )
    return requested


# --------------------------------------------------------------------------
# The launch server (Python's forkserver with torch preloaded)
# --------------------------------------------------------------------------
_server_variables: dict[str, str | None] | None = None
_server_owner: int | None = None  # the process that started the server
_server_lock = threading.Lock()


def _import_time_variables() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in _IMPORT_TIME_VARIABLES}


def _server_context():
    """The forkserver context, with a server whose torch saw this kernel's import-time variables."""
    global _server_variables, _server_owner
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    with _server_lock:
        server = forkserver._forkserver
        if _server_owner is not None and _server_owner != os.getpid():
            # A process forked from one that ran launches (e.g. a learner's forked helper):
            # the server belongs to the parent; start our own.
            server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
        _server_owner = os.getpid()
        wanted = _import_time_variables()
        if _server_variables is not None and _server_variables != wanted:
            with contextlib.suppress(Exception):
                server._stop()  # next start picks up the new variables
        ctx.set_forkserver_preload(_SERVER_PRELOAD)
        _server_variables = wanted
        forkserver.ensure_running()
    return ctx


_starter: dict = {}  # the thread that starts sandboxes for launches made from other threads


def _in_a_lasting_thread(start) -> None:
    """Run ``start()`` (which forks the sandbox's first process) in a thread that lives as long as the
    judge: bwrap's --die-with-parent kills the sandbox when the *thread* that forked it ends (the
    kernel's parent-death signal follows the thread), so a launch from a short-lived thread would
    leave a sandbox that dies with that thread."""
    if threading.current_thread() is threading.main_thread():
        start()
        return
    import queue

    if "requests" not in _starter:  # made once (the caller holds _server_lock)
        _starter["requests"] = queue.Queue()

        def serve(requests):
            while True:
                job, done = requests.get()
                try:
                    job()
                    done.put(None)
                except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                    done.put(exc)

        threading.Thread(target=serve, args=(_starter["requests"],), name="sandbox-starter", daemon=True).start()
    done: queue.Queue = queue.Queue()
    _starter["requests"].put((start, done))
    failure = done.get()
    if failure is not None:
        raise failure


def _sandbox_ended(sandbox) -> LaunchError:
    return LaunchError(f"the learner side's sandbox has ended: {sandbox.ended_because or 'it exited'}")


def _sandbox_context(sandbox):
    """A context whose processes start from a launch server of their own inside ``sandbox`` (grading).

    Its own server, not the kernel's: the judge's plain launches (references) keep theirs, and
    nothing of the learner side is ever forked from a process outside the sandbox.
    """
    from multiprocessing import forkserver, spawn

    with _server_lock:
        if sandbox.server is None:
            if sandbox.pid is not None:  # its server was started once and is gone: so is everything in it
                raise _sandbox_ended(sandbox)
            from multiprocessing import resource_tracker

            resource_tracker.ensure_running()  # the judge's own, outside: started before the swap below
            server = forkserver.ForkServer()
            server.set_forkserver_preload(_SERVER_PRELOAD)
            plain = spawn.get_executable()
            try:
                spawn.set_executable(sandbox.executable())
                _in_a_lasting_thread(server.ensure_running)
            finally:
                spawn.set_executable(plain)
            sandbox.started(server._forkserver_pid, server)

    class Context:
        Pipe = staticmethod(mp.Pipe)

        @staticmethod
        def Process(**kwargs):
            proc = _SandboxProcess(**kwargs)
            proc._sandbox = sandbox
            return proc

    return Context


class _SandboxProcess(mp.process.BaseProcess):
    """A worker started by a grading sandbox's own launch server (see _sandbox_context)."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj):
        return _SandboxPopen(process_obj)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_sandbox", None)  # the judge's object, never the worker's
        return state


def _sandbox_popen_class():
    from multiprocessing import popen_forkserver

    return popen_forkserver.Popen


class _SandboxPopen(_sandbox_popen_class()):
    def _launch(self, process_obj):  # CPython's popen_forkserver, with the sandbox's server and pids
        from multiprocessing import forkserver, reduction, spawn, util
        from multiprocessing.context import set_spawning_popen

        sandbox = process_obj._sandbox
        prep_data = spawn.get_preparation_data(process_obj._name)
        prep_data["dir"] = str(sandbox.scratch)  # the judge's folder does not exist inside
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        if sandbox.server is None:
            raise _sandbox_ended(sandbox)
        self.sentinel, w = sandbox.server.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = sandbox.outside_pid(forkserver.read_signed(self.sentinel))  # the server knows only the pid inside
        sandbox.rank_pids.add(self.pid)  # never a "helper", in this launch or, still exiting, in the next


def warm_up() -> None:
    """Start the launch server now, in the background, so the first launch is fast.

    Called when course_lib is imported in a notebook kernel; harmless to call again.
    """
    if _default_start_method() != "forkserver" or os.environ.get("COURSE_START_METHOD"):
        return
    if os.environ.get("COURSE_GRADING") == "1" and os.environ.get("COURSE_GRADING_SANDBOX") != "0":
        return  # a grading judge: the learner side starts in each submission's sandbox, not here
    with contextlib.suppress(Exception):
        _server_context()


def _in_notebook_kernel() -> bool:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


# --------------------------------------------------------------------------
# Ports and interfaces
# --------------------------------------------------------------------------
def _reserve_port(port: int = 0) -> socket.socket:
    """Bind (without listening) to a port the OS picks (or ``port``), and keep it bound.

    While this socket holds the port, the OS hands it to no other launch; rank 0's
    store can still bind it because both sockets set SO_REUSEADDR and neither of
    ours listens. (Hosting the store in this process instead would start a server
    thread here, and forking beside a running thread can deadlock the child.)
    The holder binds the wildcard address, as the store does: a port held on loopback
    only could be one that a server listens on at another address (a class hub's
    Jupyter server, on the learner's network address), and the store would fail there.
    """
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("", port))
    return holder


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


# --------------------------------------------------------------------------
# The worker side
# --------------------------------------------------------------------------
@dataclass
class _WorkerSpec:
    rank: int
    world_size: int
    master_port: int
    backend: str | None  # None: fn initialises the process group itself
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    out_path: str
    err_path: str
    stack_path: str
    progress_path: str
    threads: int
    pg_timeout_s: float
    kernel_pid: int | None  # None: the kernel is out of sight (a grading sandbox's own pid namespace)
    environment: dict  # the notebook's os.environ at launch time
    cwd: str
    sys_path: list
    judged: "_Judged | None" = None  # a grading launch: learner code in, data out (course_lib.grading)
    output_fds: tuple | None = None  # judged: (stdout, stderr, stacks) pipes the judge drains and counts


@dataclass
class _Judged:
    """How a grading launch differs (see course_lib.grading.judge).

    The worker first runs ``prelude`` (the notebook's setup cell and the learner's answer
    cells, as source text) in a fresh ``__main__``, and sends back its result as *data*
    (``torch.save`` bytes the parent loads with ``weights_only=True``): no object the
    learner's code made is ever unpickled by the judge. ``run_as`` (uid, gid, home): a
    grader running as root starts the learner's code as an unprivileged user (without a
    sandbox). ``sandbox`` (course_lib.grading.sandbox.Sandbox): the launch server and every
    rank start inside it, and the judge measures them from outside.
    """

    prelude: list  # [(label, source), ...]
    run_as: tuple | None = None
    payloads: list | None = None  # per rank: (fn, args, kwargs) as the judge pickled them (answers by name)
    sandbox: object | None = None
    environment: dict | None = None  # what the ranks see of os.environ (None: the kernel's)
    cwd: str | None = None
    max_result_bytes: int = 256 << 20
    counts_bytes: bool = False  # the check counts bytes sent: bytes written elsewhere are refused
    # In a sandbox: each rank in a Landlock domain of its own (course_lib.grading.apart), writing only
    # to a folder of its own and to these folders, which the check shares with every rank (None: not kept apart).
    apart: dict | None = None  # {"shared": [folder, ...], "readable": [folder, ...]}

    def __getstate__(self):
        # What a rank receives: the cells to run. Never the other ranks' payloads (each rank's
        # own travels in its spec), the sandbox, or the environment (sent as the spec's).
        return {"prelude": self.prelude, "run_as": self.run_as, "apart": self.apart}

    def __setstate__(self, state):
        self.__init__(**state)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent(kernel_pid: int | None) -> None:
    """Make sure this worker never outlives the notebook kernel that launched it.

    The direct parent is the kernel (spawn, fork) or the launch server, which itself
    exits when the kernel does.
    """
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch():  # portable fallback (macOS), and the kernel itself when the server is our parent
        while True:
            if os.getppid() != parent or (kernel_pid is not None and not _alive(kernel_pid)):
                os._exit(1)
            time.sleep(0.5)

    if kernel_pid is not None and not _alive(kernel_pid):
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


class _InheritedFd:
    """A file descriptor of the parent's that a worker receives (as its own copy) when it starts."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):  # forkserver and spawn: the descriptor travels beside the pickle
        from multiprocessing import reduction

        return _fd_in_worker, (reduction.DupFd(self.fd),)


def _fd_in_worker(duplicate) -> int:
    return duplicate.detach()


def _fd_of(inherited) -> int:
    return inherited.fd if isinstance(inherited, _InheritedFd) else inherited


def _redirect_stdio(out_path: str, err_path: str, fds: tuple | None = None) -> None:
    """Send this process's stdout/stderr (Python and C level) into per-rank files, or given pipes."""
    for index, (fd, path) in enumerate(((1, out_path), (2, err_path))):
        if fds is not None:
            target = _fd_of(fds[index])
        else:
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        open(1, "wb", buffering=0, closefd=False), encoding="utf-8", errors="replace", line_buffering=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        open(2, "wb", buffering=0, closefd=False), encoding="utf-8", errors="replace", line_buffering=True
    )


def _adopt_notebook_state(spec: _WorkerSpec) -> None:
    """See what the notebook sees: its environment, working directory and import path."""
    os.environ.clear()
    os.environ.update(spec.environment)
    with contextlib.suppress(OSError):
        os.chdir(spec.cwd)
    sys.path[:] = spec.sys_path


def _set_torchrun_environment(spec: _WorkerSpec) -> None:
    os.environ.update(
        RANK=str(spec.rank),
        LOCAL_RANK=str(spec.rank),
        WORLD_SIZE=str(spec.world_size),
        LOCAL_WORLD_SIZE=str(spec.world_size),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.master_port),
        OMP_NUM_THREADS=str(spec.threads),
    )
    os.environ[_SEES_ALL_GPUS_VARIABLE] = "1"
    os.environ[_PROGRESS_FILE_VARIABLE] = spec.progress_path
    loopback = _loopback_interface()
    if loopback:  # one machine: keep gloo on loopback, whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)


def _frames_of(exc: BaseException) -> list[tuple]:
    """The traceback from the learner's function down, as plain tuples the parent formats.

    The parent fills in source lines and names notebook cells: it has the kernel's
    cell files, which a worker started from a server or by spawn does not.
    """
    return [(f.filename, f.lineno, f.name, f.line or "")
            for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]


def _call_user_function(fn, args, kwargs):
    return fn(*args, **kwargs)


def _report(conn, message, payload: bytes | None = None) -> None:
    # Headers are JSON, so reading a message never runs code the worker chose; a result
    # follows as a second frame (cloudpickle for lessons, torch.save data when judged).
    conn.send_bytes(json.dumps(message).encode("utf-8"))
    if payload is not None:
        conn.send_bytes(payload)


def _drop_privileges(run_as) -> None:
    """A grader running as root: the learner's code runs as an unprivileged user."""
    uid, gid, home = run_as
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.environ.update(HOME=home, TMPDIR=home)
    tempfile.tempdir = None


def _run_prelude(prelude) -> None:
    """Run the learner's cells (setup first) in a fresh __main__, as a kernel would."""
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    os.environ["COURSE_LEARNER_SIDE"] = "1"  # course_lib.grading.Learner() is inert here
    for index, (label, source) in enumerate(prelude):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # a cell's prints are not the check's
                exec(compile(source, f"<{label}>", "exec"), main.__dict__)
        except Exception as exc:  # noqa: BLE001 - as in a notebook, a failing cell does not stop the next
            if index == 0:
                raise  # the setup cell is the course's: nothing can run without it
            PRELUDE_ERRORS.append((label, type(exc).__name__, str(exc)))
            print(f"{label} raised {type(exc).__name__}: {exc}", file=sys.stderr)


PRELUDE_ERRORS: list = []  # in a judged worker: (cell label, exception type, message) per failing cell


def _bytes_written_so_far(spec) -> int | None:
    """This process's written bytes (Linux) minus its output files': sockets and pipes so far.

    With output pipes (a judged launch) the judge subtracts what it drained from them itself."""
    try:
        with open("/proc/self/io") as f:
            counts = dict(line.split(": ") for line in f.read().splitlines() if ": " in line)
        files = 0 if spec.output_fds is not None else sum(
            os.path.getsize(path) for path in (spec.out_path, spec.err_path, spec.progress_path)
            if os.path.exists(path))
        return int(counts["wchar"]) - files
    except (OSError, ValueError, KeyError):
        return None


def _data_payload(result) -> bytes:
    """The result as torch.save bytes; the parent accepts them only as plain data (_load_data)."""
    import torch

    buffer = io.BytesIO()
    torch.save(result, buffer)
    return buffer.getvalue()


def _keep_apart(apart: dict) -> None:
    """Graded in a sandbox: this rank reaches the others only over the network (course_lib.grading.apart).
    Its working directory, TMPDIR and HOME become a folder of its own."""
    import tempfile

    from .grading.apart import deny_side_sockets, keep_rank_apart

    private = os.path.join(tempfile.gettempdir(), f"rank-{os.getpid()}")
    keep_rank_apart(private, list(apart["shared"]), list(apart["readable"]))
    deny_side_sockets()
    os.chdir(private)
    os.environ.update(TMPDIR=private, HOME=private)
    tempfile.tempdir = None


def _worker_main(spec: _WorkerSpec, result_conn, release_conn) -> None:
    """Entry point of every worker process (forkserver, spawn or fork)."""
    os.setpgrp()  # own process group: Ctrl-C in a terminal reaches only the parent, which stops us
    _redirect_stdio(spec.out_path, spec.err_path, spec.output_fds)
    if _STACK_SIGNAL is not None:
        if spec.output_fds is not None:
            stack_file = os.fdopen(_fd_of(spec.output_fds[2]), "w")
        else:
            stack_file = open(spec.stack_path, "w")
        faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True)
    _adopt_notebook_state(spec)
    _set_torchrun_environment(spec)
    if mp.get_start_method(allow_none=True) == "forkserver":
        # Started by the launch server, the rank would start its own children (a DataLoader's
        # workers) from a new, empty server, where each imports torch again: about 300 MB and a
        # second or two of CPU each. It starts them as ranks under torchrun do: Python's default.
        mp.set_start_method(None, force=True)
    if spec.judged is not None and spec.judged.run_as is not None:
        _drop_privileges(spec.judged.run_as)  # before the parent-death signal: setuid clears it
    if spec.judged is not None and spec.judged.apart is not None:
        try:
            _keep_apart(spec.judged.apart)  # while this process has one thread: the watchdog below is another
        except Exception as exc:  # noqa: BLE001 - the grader's failure, not the learner's: say so
            _report(result_conn, (_RESULT_ERROR, "SandboxUnavailable",
                                  f"the rank could not be kept apart from the others ({type(exc).__name__}: {exc})", []))
            os._exit(1)
    _die_with_parent(spec.kernel_pid)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec.threads)
    with contextlib.suppress(Exception):  # read at import; the notebook may have set it since
        dist.set_debug_level_from_env()
    try:
        if spec.judged is not None:
            # Counted before the learner's code: what starting the interpreter wrote (spawn's
            # fresh Python runs `ldconfig -p`, and a reaped child's writes count as the parent's).
            # Also its resident memory: what a check's memory rule measures growth from.
            _report(result_conn, (_RESULT_BASELINE, _bytes_written_so_far(spec), _resident_bytes(os.getpid())))
            _run_prelude(spec.judged.prelude)
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        if spec.backend is not None:
            if "nccl" in spec.backend and rank_gpu() is not None:
                torch.cuda.set_device(rank_gpu())
            dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.pg_timeout_s))
        _report(result_conn, (_RESULT_STARTED,))
        result = _call_user_function(fn, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - report everything, SystemExit included
        sys.stdout.flush()
        sys.stderr.flush()
        _report(result_conn, (_RESULT_ERROR, type(exc).__name__, str(exc), _frames_of(exc)))
        os._exit(1)
    try:
        payload = _data_payload(result) if spec.judged is not None else _dumps(result)
    except Exception as exc:  # noqa: BLE001
        reason = (f"fn returned a {type(result).__name__} that cannot be sent back to the notebook "
                  f"({type(exc).__name__}: {exc}). Return plain Python values or tensors instead.")
        _report(result_conn, (_RESULT_UNSENDABLE, "TypeError", reason, []))
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    _report(result_conn, (_RESULT_OK,), payload)
    # Stay alive until every rank has finished: a rank that exits early would turn the
    # others' pending collectives into "connection closed" errors instead of a visible hang.
    with contextlib.suppress(EOFError, OSError):
        release_conn.recv_bytes()
    if spec.backend is not None and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------
# The parent side: naming notebook cells
# --------------------------------------------------------------------------
def _cell_number(path: str):
    """The execution count IPython gave the cell whose code lives in ``path`` (or None)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell.compile._filename_map.get(path) if shell is not None else None
    except Exception:  # noqa: BLE001 - no IPython, or another version of it
        return None


def _readable_path(path: str) -> str:
    """A notebook cell's code file as IPython names it ("Cell In[7]"), other paths unchanged."""
    number = _cell_number(path)
    return f"Cell In[{number}]" if number is not None else path


def _format_traceback(rank, frames, read_sources=True) -> str:
    """IPython's style for cells (`Cell In[7], line 3, in fn`), source lines from the kernel.

    A judged launch never reads files the worker names (read_sources=False)."""
    lines = [f"Traceback of rank {rank} (most recent call last):\n"]
    for filename, lineno, name, line in frames:
        if not line and read_sources:
            line = linecache.getline(filename, lineno).strip()
        readable = _readable_path(filename)
        where = readable if readable.startswith("Cell In[") else f'File "{readable}"'
        lines.append(f"  {where}, line {lineno}, in {name}\n")
        if line:
            lines.append(f"    {line}\n")
    return "".join(lines)


# --------------------------------------------------------------------------
# The parent side: launching and waiting
# --------------------------------------------------------------------------
def _validate(fn, world_size, timeout, args, kwargs, startup_timeout):
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__} {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not callable(fn):
        raise TypeError(f"fn must be a function (callable), got {type(fn).__name__} {fn!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple of positional arguments, got {type(args).__name__}; "
                        f"for one argument write args=(x,)")
    if not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    for name, value in (("timeout", timeout), ("startup_timeout", startup_timeout)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _validate_threads(threads):
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int (intra-op threads per rank), got {threads!r}")


@contextlib.contextmanager
def _without_main_module_import():
    """Start workers without re-importing the notebook's or script's ``__main__``.

    multiprocessing makes a spawned (or server-forked) child import the parent's main
    module, which runs a script's top level again (and needs the
    ``if __name__ == "__main__"`` guard). fn travels by value, so the workers need none of it.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data

    def without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = original


def _code_with_its_file(code):
    """cloudpickle's reduction of a code object, with the file name it had. cloudpickle 3.1.3 and
    later write "<dynamic-code>" instead (so that a pickle does not depend on where the code was
    defined); the rank's traceback would then no longer say which notebook cell raised."""
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)
    return constructor, tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)


class CodeFilePickler(cloudpickle.CloudPickler):
    """cloudpickle, keeping each function's file name (see _code_with_its_file)."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_with_its_file},
                                          cloudpickle.CloudPickler.dispatch_table)


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    CodeFilePickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _serialise_call(fn, args, kwargs) -> bytes:
    """Pickle fn and its arguments by value, as a worker in another process needs them."""
    try:
        return _dumps((fn, tuple(args), kwargs))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        raise TypeError(
            f"fn or its arguments cannot be sent to the worker processes ({type(exc).__name__}: {exc}). "
            "Pass plain values, tensors or modules; create locks, open files, sockets and "
            "generators inside fn instead."
        ) from None


class _LiveView:
    """Shows the ranks' progress in one notebook display while a launch runs.

    Text (each rank's latest lines) by default; per-rank progress bars (ipywidgets)
    once a rank calls ``report_progress``. The display is emptied at the end, so the
    stored cell output holds only the ordered transcript printed afterwards.
    """

    def __init__(self, enabled: bool, world_size: int):
        self.handle = None
        self.bars = None
        self.bars_since = None
        self.world_size = world_size
        self.last = 0.0
        if not enabled or not _in_notebook_kernel():
            return
        from IPython.display import display

        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def update(self, started, out_paths, progress_paths):
        if self.handle is None or time.monotonic() - self.last < _LIVE_REFRESH_S:
            return
        self.last = time.monotonic()
        progress = [_read_progress(path) for path in progress_paths]
        if any(progress) and self._show_bars(progress):
            return
        lines = [f"running for {time.monotonic() - started:.0f} s ..."]
        for rank, path in enumerate(out_paths):
            tail = _read_text(path).splitlines()[-2:]
            lines += [f"[rank {rank}] {line}" for line in tail]
        self.handle.update({"text/plain": "\n".join(lines)}, raw=True)

    def _show_bars(self, progress) -> bool:
        try:
            import ipywidgets as widgets
        except ImportError:
            return False
        if self.bars is None:
            self.bars = [widgets.IntProgress(min=0, max=1, description=f"rank {rank}")
                         for rank in range(self.world_size)]
            self.labels = [widgets.Label("") for _ in range(self.world_size)]
            rows = [widgets.HBox([bar, label]) for bar, label in zip(self.bars, self.labels)]
            self.box = widgets.VBox(rows)
            self.handle.update(self.box)
            self.bars_since = time.monotonic()
        for bar, label, state in zip(self.bars, self.labels, progress):
            if state:
                step, total = state
                bar.max, bar.value = max(total, 1), min(step, max(total, 1))
                label.value = f"{step} / {total}"
        return True

    def finish(self, progress_paths):
        """After a successful launch: the bars at their final values, on screen long enough to see."""
        if self.handle is None:
            return
        progress = [_read_progress(path) for path in progress_paths]
        if any(progress) and self._show_bars(progress):
            time.sleep(max(0.0, self.bars_since + _BARS_SHOWN_AT_LEAST_S - time.monotonic()))

    def close(self):
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
        if self.bars is not None:
            self.box.close()
            for widget in self.bars + self.labels:
                widget.close()


def _read_progress(path: str):
    text = _read_text(path).split()
    if len(text) == 2 and all(part.lstrip("-").isdigit() for part in text):
        return int(text[0]), int(text[1])
    return None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _placement_line(world_size: int, backend: str | None) -> str | None:
    """Where a launch's ranks run, in a line, on a machine with a GPU (None without one: every rank
    is on the CPU, as on a laptop). The same rule as rank_gpu(): a GPU per rank, or none."""
    gpus = _visible_gpus()
    if gpus == 0:
        return None
    ranks = f"{world_size} rank{'s' if world_size > 1 else ''}"
    if gpus >= world_size:
        places = "on cuda:0" if world_size == 1 else f"each on a GPU of its own (cuda:0 to cuda:{world_size - 1})"
        group = "CUDA tensors over NCCL, CPU tensors over gloo" if backend and "nccl" in backend else \
            f"the group is {backend or 'made by fn'}"
        return f"{ranks} {places}: {group}"
    return (f"{ranks} on the CPU (gloo): {gpus} GPU{'s' if gpus > 1 else ''} for {world_size} ranks, "
            "so no rank takes one (rank_device() is the CPU)")


def _print_transcript(out_paths, err_paths, world_size) -> None:
    """Each rank's output, in rank order, each line prefixed with its rank."""
    for stream, paths in ((sys.stdout, out_paths), (sys.stderr, err_paths)):
        for rank in range(world_size):
            text = _read_text(paths[rank])
            for line in text.splitlines():
                stream.write(f"[rank {rank}] {line}\n")
        stream.flush()


_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_HIDDEN_FRAMES = ("multiprocessing", os.path.join("course_lib", "launcher.py"), "<frozen ", "threading.py")


def _parse_stack(text: str, read_sources: bool = True) -> list[str] | None:
    """Turn a faulthandler dump into the main thread's frames, outermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    for block in blocks:
        if "_worker_main" not in block:
            continue  # not the main thread (e.g. the parent watchdog)
        frames = [match for match in map(_FRAME.match, block.splitlines()) if match]
        frames.reverse()
        # Keep only what runs inside fn (or, before fn starts, inside init_process_group):
        # the stack also shows the server's or the kernel's frames below ours.
        for entry_point in ("_call_user_function", "_worker_main"):
            entry = [i for i, frame in enumerate(frames) if frame["func"] == entry_point]
            if entry:
                frames = frames[entry[-1] + 1:]
                break
        shown = []
        for frame in frames:
            path = frame["file"]
            if any(hidden in path for hidden in _HIDDEN_FRAMES):
                continue
            if "site-packages" in path or "dist-packages" in path:
                library_path = re.split(r"[\\/](?:site|dist)-packages[\\/]", path)[-1]
                shown.append(f"{library_path} in {frame['func']}")
            else:
                readable = _readable_path(path)
                where = readable if readable.startswith("Cell In[") else f'File "{readable}"'
                entry = f'{where}, line {frame["line"]}, in {frame["func"]}'
                source = linecache.getline(path, int(frame["line"])).strip() if read_sources else ""
                shown.append(f"{entry}: {source}" if source else entry)
        return shown
    return None


def _collect_stacks(procs, pending, stack_paths, wait_s=5.0, read_sources=True) -> dict[int, list[str]]:
    if _STACK_SIGNAL is None:
        return {}
    for rank in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[rank].pid, _STACK_SIGNAL)
    stacks: dict[int, list[str]] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(stacks) < len(pending):
        for rank in pending:
            if rank not in stacks:
                parsed = _parse_stack(_read_text(stack_paths[rank]), read_sources)
                if parsed is not None:
                    stacks[rank] = parsed
        time.sleep(0.05)
    return stacks


def _stop_workers(procs, grace_s: float) -> None:
    """Wait up to grace_s for workers to exit, then kill each one's whole process group."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.pid is None:
            continue
        for kill in (os.killpg, os.kill):  # the group takes the worker's own children too
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.join(5)


def _describe_exit(code) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def launch(
    fn,
    world_size: int = 4,
    args=(),
    kwargs=None,
    *,
    timeout: float = 120,
    backend: str | None = "auto",
    init_process_group: bool = True,
    start_method: str | None = None,
    threads: int | None = None,
    show_output: bool = True,
    live: bool = True,
    startup_timeout: float = 120,
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` worker processes; return their results in rank order.

    timeout: seconds fn may run, counted from when every rank has entered it.
    startup_timeout: seconds the ranks may take to start and join the process group.
    backend: "auto" (gloo; with a GPU per rank "cpu:gloo,cuda:nccl"), "gloo", "nccl",
        or any backend string torch accepts.
    init_process_group: False leaves ``dist.init_process_group`` to ``fn`` itself
        (the torchrun environment variables are set either way).
    start_method: None chooses (a launch server on Linux, spawn on macOS/Windows, or
        $COURSE_START_METHOD); or force "forkserver", "spawn" or "fork".
    threads: intra-op threads per rank (default: the cores divided by world_size).
    show_output: print each rank's output, in rank order, when the launch ends.
    live: in a notebook, show the ranks' progress while they run.

    Raises WorkerError when a rank raises or dies (the other ranks are stopped at
    once; when the first error is a lost connection, up to a second later, blaming the
    rank that died or raised an error of its own and listing the others), WorkerTimeout when a time limit passes (with every rank's stack and
    whether it was inside a collective), and TypeError/ValueError for bad arguments.
    """
    results, _ = _launch(fn, world_size, args, kwargs, timeout=timeout, backend=backend,
                         init_process_group=init_process_group, start_method=start_method, threads=threads,
                         show_output=show_output, live=live, startup_timeout=startup_timeout)
    return results


def _launch(fn, world_size, args, kwargs, *, timeout, backend, init_process_group, start_method, threads,
            show_output, live, startup_timeout, judged: _Judged | None = None):
    """launch() itself; with ``judged``, also each rank's measurements (see _Waiter.measure)."""
    kwargs = {} if kwargs is None else kwargs
    _validate(fn, world_size, timeout, args, kwargs, startup_timeout)
    if threads is None:
        threads = threads_per_rank(world_size)
    _validate_threads(threads)
    method = _choose_start_method(start_method, threads)
    if backend == "auto":
        backend = choose_backend(world_size)
    if not init_process_group:
        backend = None
    if judged is not None and judged.payloads:
        payloads = judged.payloads
    else:
        payloads = [_serialise_call(fn, args, kwargs)] * world_size
    sandbox = judged.sandbox if judged is not None else None
    if sandbox is not None:
        ctx = _sandbox_context(sandbox)
    else:
        ctx = _server_context() if method == "forkserver" else mp.get_context(method)
    workdir = tempfile.mkdtemp(prefix="course_launch_")
    if judged is not None and judged.run_as is not None:
        home = os.path.join(workdir, "home")  # the unprivileged learner's HOME and TMPDIR
        os.mkdir(home, 0o700)
        os.chown(home, judged.run_as[0], judged.run_as[1])
        judged.run_as = (judged.run_as[0], judged.run_as[1], home)
    paths = {kind: [os.path.join(workdir, f"rank{r}.{kind}") for r in range(world_size)]
             for kind in ("out", "err", "stack", "progress")}
    port_holder = _reserve_port()  # 30 learners launching at once on one server never collide
    procs, result_conns, release_conns = [], [], []
    live_view = _LiveView(live and show_output, world_size)
    environment = dict(os.environ) if judged is None or judged.environment is None else dict(judged.environment)
    drains: list[_Drain] = []
    loopback_before = sandbox.loopback_bytes() if sandbox is not None else None
    succeeded = False
    try:
        for rank in range(world_size):
            result_recv, result_send = ctx.Pipe(duplex=False)
            release_recv, release_send = ctx.Pipe(duplex=False)
            output_fds = None
            if judged is not None:  # what a rank prints reaches the judge through pipes it drains and counts
                rank_drains = [_Drain(paths[kind][rank]) for kind in ("out", "err", "stack")]
                drains += rank_drains
                output_fds = tuple(_InheritedFd(drain.write_fd) for drain in rank_drains)
            spec = _WorkerSpec(
                rank=rank,
                world_size=world_size,
                master_port=port_holder.getsockname()[1],
                backend=backend,
                payload=payloads[rank],
                out_path=paths["out"][rank],
                err_path=paths["err"][rank],
                stack_path=paths["stack"][rank],
                progress_path=paths["progress"][rank],
                threads=threads,
                # longer than ours: a hang surfaces here, with stacks, not as a gloo timeout
                pg_timeout_s=_MAX_STRETCH * (startup_timeout + timeout) + 60,
                kernel_pid=None if sandbox is not None else os.getpid(),
                environment=environment,
                cwd=judged.cwd if judged is not None and judged.cwd else os.getcwd(),
                sys_path=list(sys.path),
                judged=judged,
                output_fds=output_fds,
            )
            proc = ctx.Process(target=_worker_main, args=(spec, result_send, release_recv), daemon=False)
            with warnings.catch_warnings(), _without_main_module_import():
                # Python 3.12+ warns on fork in a threaded process; the child replaces its
                # stdio at once and only runs our worker code, which is the safe pattern.
                warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
                proc.start()
            result_send.close()
            release_recv.close()
            if output_fds is not None:
                for drain in drains[-3:]:
                    drain.started()
            procs.append(proc)
            result_conns.append(result_recv)
            release_conns.append(release_send)

        waiter = _Waiter(procs, result_conns, paths, live_view, judged=judged, drains=drains,
                         loopback_before=loopback_before)
        results = waiter.wait(timeout, startup_timeout)
        succeeded = True
        for conn in release_conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"done")
        live_view.finish(paths["progress"])
        return results, waiter.measurements
    finally:
        _stop_workers(procs, grace_s=5.0 if succeeded else 0.0)
        for drain in drains:
            drain.close()
        live_view.close()
        for conn in result_conns + release_conns:
            conn.close()
        if show_output:
            placement = _placement_line(world_size, backend)
            if placement:
                print(placement)
            _print_transcript(paths["out"], paths["err"], world_size)
        port_holder.close()
        for path in sum(paths.values(), []):
            for leftover in (path, path + ".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
        if judged is not None:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(workdir)


def _load_data(payload: bytes, rank: int, world_size: int):
    """A judged rank's result: plain data only (tensors, numbers, strings, containers)."""
    import torch

    try:
        return torch.load(io.BytesIO(payload), weights_only=True)
    except Exception:  # noqa: BLE001 - anything that is not plain data
        raise UnsendableResult(rank, "TypeError", "the result is not plain data (tensors, numbers, strings, "
                               "and lists/tuples/dicts of them)", "", world_size) from None


class _Drain:
    """One pipe from a judged rank (its stdout, stderr or stack dumps), read by the judge.

    Counts every byte that came through (so the rank's writes to it are not taken for bytes
    sent to its peers) and keeps the first ``keep`` bytes in the file at ``path`` for the
    report. The rank cannot change either: only the judge holds the read end.
    """

    def __init__(self, path: str, keep: int = 1 << 20):
        self.read_fd, self.write_fd = os.pipe()
        self.path, self.keep, self.count = path, keep, 0
        self.lock = threading.Lock()
        self.file = open(path, "wb")
        self.thread = threading.Thread(target=self._run, name="rank-output", daemon=True)

    def started(self) -> None:
        """The rank has its copy of the write end: close ours, so the end of the rank ends the pipe."""
        os.close(self.write_fd)
        self.write_fd = None
        self.thread.start()

    def _read(self, blocking: bool) -> bool:
        if not blocking and not select.select([self.read_fd], [], [], 0)[0]:
            return False
        try:
            chunk = os.read(self.read_fd, 1 << 16)
        except OSError:
            return False
        if not chunk:
            return False
        self.count += len(chunk)
        room = self.keep - self.file.tell()
        if room > 0:
            self.file.write(chunk[:room])
            self.file.flush()
        return True

    def _run(self) -> None:
        while True:
            with self.lock:
                if self.read_fd is None:
                    return
            ready = select.select([self.read_fd], [], [], 0.2)[0]
            with self.lock:
                if self.read_fd is None:
                    return
                if ready and not self._read(blocking=True):
                    return

    def drained(self) -> int:
        """Every byte the rank has written to this pipe so far (what is waiting is read first)."""
        with self.lock:
            while self.read_fd is not None and self._read(blocking=False):
                pass
            return self.count

    def close(self) -> None:
        with self.lock:
            for fd in (self.read_fd, self.write_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.read_fd = self.write_fd = None
            self.file.close()


class MeasurementRefused(LaunchError):
    """A judged launch whose measurements show bytes that did not go where the rules count them."""


_MEMORY_SAMPLE_SECONDS = 0.01
# Loopback counts whole frames: each packet adds 14 (link) + 20 (IPv4) + 20-60 (TCP) bytes of headers.
_FRAME_HEADER_BYTES = (14 + 20 + 8, 14 + 20 + 60)  # the least (UDP) and the most (TCP, all options)
_BYTES_SLACK = 64 << 10
# After a rank reports a lost connection, how long to watch the other ranks for the cause.
_FAILURE_GRACE_S = 1.0
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _cpu_wait_s(pid) -> float:
    """Seconds the process (its main thread) was ready to run but waited for a CPU (Linux), or 0."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _resident_bytes(pid) -> int:
    """A process's resident memory now (Linux), or 0."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


class _Waiter:
    """Collects each rank's messages until all have returned, one fails, or time runs out."""

    def __init__(self, procs, result_conns, paths, live_view, judged=None, drains=(), loopback_before=None):
        self.procs, self.conns, self.paths, self.live_view = procs, result_conns, paths, live_view
        self.judged = judged is not None
        self.sandbox = judged.sandbox if judged is not None else None
        self.max_result_bytes = judged.max_result_bytes if judged is not None else None
        self.drains = [list(drains[3 * r:3 * r + 3]) for r in range(len(procs))] if drains else None
        self.drained_at_baseline = {}
        self.payload_bytes = {}
        self.loopback_before = loopback_before
        self.counts_bytes = judged is not None and judged.counts_bytes
        self.started_at = time.time()
        self.helper_peak = 0  # sandbox: the most memory that processes other than the ranks held at once
        self._helpers_sampled = 0.0
        self.measurements = [None] * len(procs)
        self.sampled_rss = [0] * len(procs)  # judged: the most resident memory seen from outside
        self.start_rss = {}  # judged: each rank's resident memory before any learner code ran
        self.baselines = {}  # judged: rank -> bytes written before the learner's code ran
        self.world_size = len(procs)
        self.results = [None] * self.world_size
        self.pending = set(range(self.world_size))
        self.entered = set()  # ranks that have entered fn
        self.conn_rank = {id(conn): rank for rank, conn in enumerate(result_conns)}
        self.sentinel_rank = {proc.sentinel: rank for rank, proc in enumerate(procs)}

    def _cpu_waits(self) -> list[float]:
        return [_cpu_wait_s(proc.pid) for proc in self.procs]

    def _past(self, elapsed, limit, waits_before) -> bool:
        """Has more than ``limit`` passed, not counting the longest any rank waited for a CPU?"""
        if elapsed <= limit:
            return False  # /proc is read only once the plain deadline has passed
        if self.judged:
            return True   # grading: the grader's own per-cell time limit is wall time; keep the plain rule
        waited = max(now - before for now, before in zip(self._cpu_waits(), waits_before))
        self.waited = min(max(waited, 0.0), (_MAX_STRETCH - 1) * limit)
        return elapsed - self.waited > limit

    def wait(self, timeout, startup_timeout):
        launched = time.monotonic()
        fn_started = fn_waits = None
        self.waited = 0.0
        poll = _MEMORY_SAMPLE_SECONDS if self.judged else 0.1
        while self.pending:
            if self.judged:
                self._sample_memory()
                if self.sandbox is not None and self.sandbox.ended_because:
                    raise WorkerError(min(self.pending), "SandboxLimit", f"the submission's sandbox was ended: "
                                      f"{self.sandbox.ended_because}", "", self.world_size)
            try:
                for ready in wait_for_any(self._watched(), timeout=poll):
                    self._handle(ready)
            except WorkerError as first:
                error = self._with_the_others(first)
                self.pending.discard(error.rank)
                late = self._what_is_waiting()
                failed = {error.rank} | {other.rank for other in [*error.also_failed, *late]}
                finished = set(range(self.world_size)) - self.pending - failed
                raise error.with_every_rank(finished, late) from None
            now = time.monotonic()
            if fn_started is None and len(self.entered) == self.world_size:
                fn_started, fn_waits = now, self._cpu_waits()
            if not self.pending:
                break
            if fn_started is not None and self._past(now - fn_started, timeout, fn_waits):
                stacks = _collect_stacks(self.procs, self.pending, self.paths["stack"], read_sources=not self.judged)
                raise WorkerTimeout(timeout, stacks, set(range(self.world_size)) - self.pending,
                                    self.world_size, waited_s=self.waited)
            if fn_started is None and self._past(now - launched, startup_timeout, [0.0] * self.world_size):
                stacks = _collect_stacks(self.procs, self.pending, self.paths["stack"], read_sources=not self.judged)
                raise WorkerTimeout(startup_timeout, stacks, set(self.entered), self.world_size,
                                    phase="startup", waited_s=self.waited)
            self.live_view.update(launched, self.paths["out"], self.paths["progress"])
        if self.judged:
            self._measure_all()
        return self.results

    def _watched(self) -> list:
        """What to wait on: each pending rank's result pipe and its process's exit."""
        return [self.conns[r] for r in self.pending] + [self.procs[r].sentinel for r in self.pending]

    def _what_is_waiting(self) -> list[WorkerError]:
        """Read what the other ranks sent before the failure was reported (a result that came in at
        the same moment is a rank that finished); the errors among it."""
        errors = []
        for rank in sorted(self.pending):
            while rank in self.pending and self.conns[rank].poll():
                try:
                    self._handle(self.conns[rank])
                except WorkerError as error:
                    errors.append(error)
                    self.pending.discard(rank)
                except (EOFError, OSError):
                    break
        return errors

    def _with_the_others(self, first: WorkerError) -> WorkerError:
        """A rank that lost a connection is usually not the cause: watch the others a moment longer.

        When a rank dies, its peers' sockets close at once and gloo raises "Connection closed by
        peer" on them; that error can reach the launcher before the death does. So after such an
        error the launcher waits up to _FAILURE_GRACE_S for the other ranks and blames the rank
        that died or raised an error of its own (see _root_cause), naming the others too.
        """
        if not _lost_a_peer(first):
            return first  # a rank that died or raised an error of its own is the cause: report it as it is
        failures = [first]
        self.pending.discard(first.rank)
        deadline = time.monotonic() + _FAILURE_GRACE_S
        while self.pending:
            for ready in wait_for_any(self._watched(), timeout=max(0.0, deadline - time.monotonic())):
                try:
                    self._handle(ready)
                except WorkerError as error:
                    failures.append(error)
                    self.pending.discard(error.rank)
            if time.monotonic() >= deadline or not all(_lost_a_peer(f) for f in failures):
                break  # time is up, or the cause has shown itself
        return _root_cause(failures, self.world_size)

    def _handle(self, ready):
        rank = self.sentinel_rank[ready] if isinstance(ready, int) else self.conn_rank[id(ready)]
        if rank not in self.pending:
            return
        if isinstance(ready, int):  # the process exited
            if self.conns[rank].poll():
                return  # a message (or end-of-pipe) is waiting: the pipe branch reads it
            raise self._died(rank)
        try:
            message = self._read_header(rank)
        except EOFError:  # the pipe closed with nothing in it: the process died
            raise self._died(rank) from None
        kind = message[0]
        if kind == _RESULT_BASELINE:
            self.baselines[rank] = message[1]
            self.start_rss[rank] = message[2] or 0
            if self.drains is not None:
                self.drained_at_baseline[rank] = sum(drain.drained() for drain in self.drains[rank])
        elif kind == _RESULT_STARTED:
            self.entered.add(rank)
        elif kind in (_RESULT_ERROR, _RESULT_UNSENDABLE):
            error_class = UnsendableResult if kind == _RESULT_UNSENDABLE else WorkerError
            _, exc_type, text, frames = message
            remote_tb = _format_traceback(rank, frames, read_sources=not self.judged) if frames else ""
            raise error_class(rank, str(exc_type), str(text), remote_tb, self.world_size)
        else:
            try:
                payload = self.conns[rank].recv_bytes(self.max_result_bytes)
            except OSError:  # longer than max_result_bytes: the pipe is not read further
                limit = f"{self.max_result_bytes / 2**20:g} MiB"
                raise WorkerError(rank, "ResultTooLarge", f"the rank's result is larger than the {limit} a check "
                                  "accepts", "", self.world_size) from None
            self.entered.add(rank)
            if self.judged:
                self.payload_bytes[rank] = len(payload)
                self.results[rank] = _load_data(payload, rank, self.world_size)
            else:
                self.results[rank] = cloudpickle.loads(payload)
            self.pending.discard(rank)

    def _read_header(self, rank):
        raw = self.conns[rank].recv_bytes(1 << 20)
        try:
            message = json.loads(raw.decode("utf-8"))
            if not isinstance(message, list) or not message or message[0] not in (
                    _RESULT_STARTED, _RESULT_BASELINE, _RESULT_ERROR, _RESULT_UNSENDABLE, _RESULT_OK):
                raise ValueError
            if message[0] == _RESULT_BASELINE:
                if rank in self.baselines or len(message) != 3 or not all(
                        isinstance(value, (int, type(None))) for value in message[1:]):
                    raise ValueError  # once, before the learner's code: a second one is forged
            if message[0] in (_RESULT_ERROR, _RESULT_UNSENDABLE):
                _, exc_type, text, frames = message
                frames = [(str(f), int(n), str(name), str(line)) for f, n, name, line in frames]
                message = [message[0], exc_type, text, frames]
            return message
        except (ValueError, TypeError, UnicodeDecodeError):
            raise WorkerError(rank, "ProtocolError", "the worker sent a message that is not the launcher's", "",
                              self.world_size) from None

    def _sample_memory(self):
        for rank in range(self.world_size):
            rss = _resident_bytes(self.procs[rank].pid)
            if rss > self.sampled_rss[rank]:
                self.sampled_rss[rank] = rss
        now = time.monotonic()
        if self.sandbox is not None and now - self._helpers_sampled > 0.25:
            self._helpers_sampled = now
            # Not helpers: this launch's ranks, an earlier launch's ranks still exiting (their memory
            # is being freed), bwrap, its init and the launch server. A helper counts by the memory it
            # holds of its own: a rank's child between fork and exec shares all of the rank's pages.
            not_helpers = self.sandbox.rank_pids | self.sandbox.infrastructure_pids()
            helpers = self.sandbox.private_bytes(pid for pid in self.sandbox.processes_inside() if pid not in not_helpers)
            self.helper_peak = max(self.helper_peak, helpers)

    def _measure_all(self):
        """Every rank measured at once, as all of them wait to be released (see measure)."""
        for rank in range(self.world_size):
            measured = self.measure(rank, self.payload_bytes.get(rank, 0))
            if measured is None and sys.platform.startswith("linux"):
                raise WorkerError(rank, "NotMeasured", "the rank's process could not be measured after it returned "
                                  "(did it exit before it was released?)", "", self.world_size)
            self.measurements[rank] = measured
        if self.sandbox is not None and self.loopback_before is not None and self.counts_bytes:
            network = self._check_where_bytes_went()
            for measured in self.measurements:  # a total, the same for every rank
                measured["network_bytes"] = network
        if self.counts_bytes:
            sent, to_others = self._rank_flows()
            for rank, measured in enumerate(self.measurements):
                measured["sent_to"] = sent[rank] if sent is not None else None
                measured["sent_to_others"] = to_others[rank] if to_others is not None else None
                if sent is not None:  # what reached the other ranks, not what the process wrote (a file, /dev/null)
                    # Not sent[rank][rank]: rank 0's own client talking to the TCPStore it hosts, 0.9 to
                    # 3.5 KB that grow with how long it waits for the others, and reach no other rank.
                    measured["sent_bytes"] = sum(n for peer, n in enumerate(sent[rank]) if peer != rank)

    def _rank_flows(self):
        """Bytes per ordered pair of ranks over TCP, read from the kernel while every rank waits to be
        released (course_lib.grading.tcp_flows); (None, None) where that cannot be read (not Linux, or
        outside a sandbox where sock_diag is refused). In a sandbox, unreadable counts refuse the check."""
        if not sys.platform.startswith("linux"):
            return None, None
        from .grading.tcp_flows import diag_socket, rank_flows

        pids = [proc.pid for proc in self.procs]
        if self.sandbox is None:  # a learner's own check, or --no-sandbox: a container may forbid sock_diag
            try:
                with diag_socket() as diag:
                    return rank_flows(diag, pids)
            except OSError:
                return None, None  # the check says the byte rule was skipped
        try:
            return rank_flows(self.sandbox.tcp_diag(), pids)
        except (OSError, LookupError) as exc:
            raise MeasurementRefused(f"the bytes between the ranks could not be read ({exc})") from None

    def _check_where_bytes_went(self) -> int:
        """Bytes the ranks wrote cannot be more than the sandbox's loopback carried, give or take headers:
        the rest went to /dev/null, a pipe or a local socket, not to a peer. (Less written than carried
        proves nothing: torch's TCPStore client sends with send(2), which the write count leaves out.)
        Returns what the loopback carried, headers taken off: the bytes that crossed the network between
        the sandbox's processes, which no file write or /dev/null can add to."""
        after = self.sandbox.loopback_bytes()
        if after is None or self.loopback_before is None:
            raise MeasurementRefused("the sandbox's loopback could not be read, so the bytes sent cannot be checked")
        frame_bytes, packets = after[0] - self.loopback_before[0], after[1] - self.loopback_before[1]
        most = frame_bytes - _FRAME_HEADER_BYTES[0] * packets
        written = sum(m["written_bytes"] for m in self.measurements)
        in_files = self.sandbox.bytes_in_files_since(self.started_at)  # a checkpoint, say: written, not sent
        slack = _BYTES_SLACK + 0.03 * max(written, most)
        if written - in_files > most + slack:
            raise MeasurementRefused(
                f"the ranks wrote {written} bytes, {in_files} of them to files, but at most {max(most, 0)} crossed the "
                "network between them: the rest went to /dev/null, pipes or local sockets, which are not communication "
                "between ranks")
        return max(most, 0)

    def measure(self, rank, payload_bytes):
        """What the kernel counted for this rank, read while it waits to be released.

        ``sent_bytes``: bytes the process wrote (write/writev: gloo's TCP sends count here)
        since it reported its baseline (before the learner's code ran), minus what the launcher
        itself knows it wrote (the result, the output files). Where the check counts bytes and the
        kernel's socket table can be read, _measure_all replaces it with the bytes that reached the
        other ranks over TCP (``sent_to`` summed over the other ranks), which no file or /dev/null write adds to.
        ``written_bytes``: what the process wrote, as ``sent_bytes`` before that (files and sockets
        alike: who wrote a checkpoint).
        ``peak_rss_bytes``: the process's peak resident memory: the larger of the kernel's
        high-water mark (VmHWM, which the process itself can reset through
        /proc/self/clear_refs) and the resident memory sampled from here every 10 ms.
        ``start_rss_bytes``: its resident memory before any learner code ran (what it shares with
        the launch server it was forked from, mostly): a rule on memory measures growth from it.
        Linux only (else None).
        """
        pid = self.procs[rank].pid
        try:
            with open(f"/proc/{pid}/io") as f:
                io_counts = dict(line.split(": ") for line in f.read().splitlines() if ": " in line)
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except (OSError, ValueError):
            return None
        if self.drains is not None:  # the pipes the judge drained: everything the rank printed
            printed = sum(drain.drained() for drain in self.drains[rank]) - self.drained_at_baseline.get(rank, 0)
        else:
            printed = sum(os.path.getsize(path) for kind in ("out", "err", "progress")
                          for path in [self.paths[kind][rank]] if os.path.exists(path))
        own = payload_bytes + printed + (self.baselines.get(rank) or 0)  # baseline: before the learner's code ran
        self._sample_memory()
        peak = max(int(status.get("VmHWM", "0 kB").split()[0]) * 1024, self.sampled_rss[rank])
        # In a sandbox a rank's helpers count as its own: memory held by another process is still held.
        written = int(io_counts.get("wchar", 0)) - own
        return {"sent_bytes": written, "written_bytes": written, "peak_rss_bytes": peak + self.helper_peak,
                "start_rss_bytes": self.start_rss.get(rank, 0),
                "network_bytes": None,  # set by _measure_all in a sandbox
                "sent_to": None, "sent_to_others": None}  # set by _measure_all when the check counts bytes

    def _died(self, rank) -> WorkerError:
        proc = self.procs[rank]
        proc.join(1)
        reason = f"the worker process {_describe_exit(proc.exitcode)} before returning"
        return WorkerError(rank, "ProcessDied", reason, "", self.world_size)


def _importing_in_launch_server() -> bool:
    """True while the launch server imports its preload (this module is the last of it)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


if _importing_in_launch_server():
    # Every rank is a copy-on-write fork of the server. Python's garbage collector writes to each
    # object it examines, so a rank's first full collection would copy most of the pages holding
    # the preloaded modules' objects into the rank's own memory. Frozen, they are never examined.
    # (Thawed when the server itself exits, so that its shutdown still frees them: nanobind
    # modules complain about objects left alive at exit. Ranks leave by os._exit.)
    import atexit
    import gc

    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)

if _in_notebook_kernel():  # start the launch server while the learner reads the first cells
    warm_up()
