"""Run one function on N real ``torch.distributed`` worker processes.

Defined in chapter 00 (preflight), used by every chapter after it::

    from course_lib import launch
    results = launch(fn, world_size=4, args=(x, y), timeout=60)

Each worker is a real operating-system process with the default process group
initialised (gloo on CPU, NCCL with one GPU per rank when there are enough GPUs)
and the same environment variables ``torchrun`` sets, so ``fn`` runs unchanged
under ``torchrun``. What the parent process does, in order:

1. reserve a free port the operating system picks and hold it for the whole
   launch, so concurrent launches never fight over a port (rank 0 hosts the
   rendezvous store on it, as with ``torchrun``);
2. start the workers, by ``fork`` where that is safe, else by ``spawn`` with
   ``fn`` sent by value (cloudpickle), so functions defined in a notebook work;
3. wait for each rank's result, a failing rank, a dead rank or the timeout;
4. on any failure stop every worker (and the workers' own children);
5. print each rank's output in rank order, prefixed ``[rank r]``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import io
import multiprocessing as mp
import os
import pickle
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
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
]

_RESULT_OK = "ok"
_RESULT_ERROR = "error"
_RESULT_UNSENDABLE = "unsendable"
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # absent on Windows
_LIVE_REFRESH_S = 0.5


# --------------------------------------------------------------------------
# Errors the notebook sees
# --------------------------------------------------------------------------
class LaunchError(RuntimeError):
    """A launch did not finish: the message says which rank and why."""


class WorkerError(LaunchError):
    """One rank raised (or died). ``rank``, ``exc_type`` and ``remote_traceback`` say how."""

    def __init__(self, rank, exc_type, message, remote_traceback, world_size):
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        others = world_size - 1
        stopped = f"\nThe other {others} rank{'s were' if others != 1 else ' was'} stopped." if others else ""
        super().__init__(
            f"rank {rank} failed with {exc_type}: {message}\n"
            f"{remote_traceback.rstrip()}{stopped}"
        )


class UnsendableResult(WorkerError, TypeError):
    """A rank's return value could not be pickled back to the notebook."""


class WorkerTimeout(LaunchError):
    """The launch ran past ``timeout``. ``stacks[rank]`` says where each rank was waiting."""

    def __init__(self, timeout, stacks, finished, world_size):
        self.timeout = timeout
        self.stacks = stacks
        self.finished = finished
        lines = [f"timed out after {timeout:g} s with {len(finished)} of {world_size} ranks finished. "
                 "Where each rank was:"]
        for rank in range(world_size):
            if rank in finished:
                lines.append(f"rank {rank}: finished fn, waiting for the other ranks")
            else:
                lines.append(f"rank {rank} was in:")
                lines.extend(f"    {frame}" for frame in stacks.get(rank, ["(no stack available)"]))
        lines.append("All ranks were stopped. A rank inside a collective that another rank never calls "
                     "(or calls in another order, or with another shape) waits forever.")
        super().__init__("\n".join(lines))


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
    """NCCL when every rank can have its own GPU, gloo otherwise."""
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def rank_device():
    """This rank's device: ``cuda:LOCAL_RANK`` when the rank has its own GPU, else the CPU.

    Chapters create tensors and models with ``.to(rank_device())`` so the same cell runs
    with gloo on a laptop and with NCCL on a GPU machine.
    """
    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and torch.cuda.device_count() > local_rank:
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _choose_start_method(requested):
    if requested is None:  # COURSE_START_METHOD=spawn runs a whole notebook as macOS would
        requested = os.environ.get("COURSE_START_METHOD") or None
    if requested not in (None, "fork", "spawn"):
        raise ValueError(f"start_method must be 'fork', 'spawn' or None (choose for me), not {requested!r}")
    fork_possible = "fork" in mp.get_all_start_methods()
    if requested == "fork":
        if not fork_possible:
            raise ValueError("start_method='fork' is not available on this platform; use start_method='spawn'.")
        if _cuda_initialised():
            raise ValueError(
                "CUDA is already initialised in this process, and a forked worker cannot use it "
                "(the CUDA driver does not survive fork). Fix: restart the kernel and call launch "
                "before any CUDA work in the notebook, or pass start_method='spawn'."
            )
        return "fork"
    if requested == "spawn":
        return "spawn"
    # macOS: system libraries are not fork-safe, so Python defaults to spawn there too.
    if not fork_possible or sys.platform == "darwin" or _cuda_initialised():
        return "spawn"
    return "fork"


def _reserve_port() -> socket.socket:
    """Bind (without listening) to a port the OS picks, and keep it bound.

    While this socket holds the port, the OS hands it to no other launch; rank 0's
    store can still bind it because both sockets set SO_REUSEADDR and neither of
    ours listens. (Hosting the store in this process instead would start a server
    thread here, and forking beside a running thread can deadlock the child.)
    """
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
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
    threads: int
    pg_timeout_s: float
    parent_pid: int


def _die_with_parent(parent_pid: int) -> None:
    """Make sure this worker never outlives the notebook kernel that started it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    def watch():  # portable fallback (macOS): poll for re-parenting
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _redirect_stdio(out_path: str, err_path: str) -> None:
    """Send this process's stdout/stderr (Python and C level) into per-rank files."""
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        open(1, "wb", buffering=0, closefd=False), encoding="utf-8", errors="replace", line_buffering=True
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        open(2, "wb", buffering=0, closefd=False), encoding="utf-8", errors="replace", line_buffering=True
    )


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
    loopback = _loopback_interface()
    if loopback:  # one machine: keep gloo on loopback, whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)


def _readable_path(path: str) -> str:
    """A notebook cell's code file as IPython names it ("Cell In[7]"), other paths unchanged.

    The kernel keeps the map from its temporary cell files to execution counts; a
    forked worker has a copy of it.
    """
    try:
        from IPython import get_ipython

        shell = get_ipython()
        number = shell.compile._filename_map.get(path) if shell is not None else None
    except Exception:  # noqa: BLE001 - no IPython, or another version of it
        number = None
    return f"Cell In[{number}]" if number is not None else path


def _user_frames_only(exc: BaseException) -> str:
    """The traceback from the learner's function down, without the launcher's frames."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    for frame in frames:
        frame.filename = _readable_path(frame.filename)
    lines = [f"Traceback of rank {os.environ.get('RANK', '?')} (most recent call last):\n"]
    lines += traceback.format_list(frames)
    # IPython's own style for cells: `Cell In[7], line 3, in fn` (no quotes, no "File").
    return re.sub(r'File "(Cell In\[\d+\])"', r"\1", "".join(lines))


def _call_user_function(fn, args, kwargs):
    return fn(*args, **kwargs)


def _report(conn, message) -> None:
    conn.send_bytes(pickle.dumps(message))


def _worker_main(spec: _WorkerSpec, result_conn, release_conn) -> None:
    """Entry point of every worker process (fork or spawn)."""
    os.setpgrp()  # own process group: Ctrl-C in a terminal reaches only the parent, which stops us
    _die_with_parent(spec.parent_pid)
    _redirect_stdio(spec.out_path, spec.err_path)
    if _STACK_SIGNAL is not None:
        stack_file = open(spec.stack_path, "w")
        faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True)
    _set_torchrun_environment(spec)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec.threads)
    try:
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        if spec.backend is not None:
            if spec.backend == "nccl":
                torch.cuda.set_device(spec.rank)
            dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.pg_timeout_s))
        result = _call_user_function(fn, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - report everything, SystemExit included
        sys.stdout.flush()
        sys.stderr.flush()
        _report(result_conn, (_RESULT_ERROR, type(exc).__name__, str(exc), _user_frames_only(exc)))
        os._exit(1)
    try:
        payload = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        reason = (f"fn returned a {type(result).__name__} that cannot be sent back to the notebook "
                  f"({type(exc).__name__}: {exc}). Return plain Python values or tensors instead.")
        _report(result_conn, (_RESULT_UNSENDABLE, "TypeError", reason, ""))
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    _report(result_conn, (_RESULT_OK, payload))
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
# The parent side
# --------------------------------------------------------------------------
def _validate(fn, world_size, timeout, args, kwargs):
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
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")


def _serialise_call(fn, args, kwargs) -> bytes:
    """Pickle fn and its arguments by value, as a spawned worker will need them.

    Fork would not need this, but checking on every platform means a function that
    works on Linux also works on macOS and Windows (which use spawn).
    """
    try:
        return cloudpickle.dumps((fn, tuple(args), kwargs))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        raise TypeError(
            f"fn or its arguments cannot be sent to the worker processes ({type(exc).__name__}: {exc}). "
            "Pass plain values, tensors or modules; create locks, open files, sockets and "
            "generators inside fn instead."
        ) from None


class _LiveView:
    """Streams the ranks' latest lines into one notebook display while a launch runs.

    The display is emptied at the end, so the stored cell output holds only the
    ordered transcript printed afterwards (and stays identical from run to run).
    """

    def __init__(self, enabled: bool):
        self.handle = None
        self.last = 0.0
        if not enabled:
            return
        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:
            return
        shell = get_ipython()
        if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
            return
        self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def update(self, started, out_paths):
        if self.handle is None or time.monotonic() - self.last < _LIVE_REFRESH_S:
            return
        self.last = time.monotonic()
        lines = [f"running for {time.monotonic() - started:.0f} s ..."]
        for rank, path in enumerate(out_paths):
            tail = _read_text(path).splitlines()[-2:]
            lines += [f"[rank {rank}] {line}" for line in tail]
        self.handle.update({"text/plain": "\n".join(lines)}, raw=True)

    def close(self):
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


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


def _parse_stack(text: str) -> list[str] | None:
    """Turn a faulthandler dump into the main thread's frames, outermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    for block in blocks:
        if "_worker_main" not in block:
            continue  # not the main thread (e.g. the parent watchdog)
        frames = [match for match in map(_FRAME.match, block.splitlines()) if match]
        frames.reverse()
        # Keep only what runs inside fn (or, before fn starts, inside init_process_group):
        # a forked worker's stack still shows the parent's frames below ours.
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
                shown.append(f'{where}, line {frame["line"]}, in {frame["func"]}')
        return shown
    return None


def _collect_stacks(procs, pending, stack_paths, wait_s=5.0) -> dict[int, list[str]]:
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
                parsed = _parse_stack(_read_text(stack_paths[rank]))
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
):
    """Run ``fn(*args, **kwargs)`` on ``world_size`` worker processes; return their results in rank order.

    backend: "auto" (NCCL with one GPU per rank if there are enough GPUs, else gloo),
        "gloo", "nccl", or any backend torch knows.
    init_process_group: False leaves ``dist.init_process_group`` to ``fn`` itself
        (the torchrun environment variables are set either way).
    start_method: None chooses fork where it is safe, else spawn; or force "fork"/"spawn".
    threads: intra-op threads per rank (default: the cores divided by world_size).
    show_output: print each rank's output, in rank order, when the launch ends.
    live: in a notebook, stream the ranks' latest lines while they run.

    Raises WorkerError when a rank raises or dies (the other ranks are stopped at
    once), WorkerTimeout when ``timeout`` seconds pass (with every rank's stack),
    and TypeError/ValueError for bad arguments.
    """
    kwargs = {} if kwargs is None else kwargs
    _validate(fn, world_size, timeout, args, kwargs)
    method = _choose_start_method(start_method)
    if backend == "auto":
        backend = choose_backend(world_size)
    if not init_process_group:
        backend = None
    if threads is None:
        threads = threads_per_rank(world_size)
    payload = _serialise_call(fn, args, kwargs)

    ctx = mp.get_context(method)
    workdir = tempfile.mkdtemp(prefix="course_launch_")
    out_paths = [os.path.join(workdir, f"rank{r}.out") for r in range(world_size)]
    err_paths = [os.path.join(workdir, f"rank{r}.err") for r in range(world_size)]
    stack_paths = [os.path.join(workdir, f"rank{r}.stack") for r in range(world_size)]
    port_holder = _reserve_port()  # 30 learners launching at once on one server never collide
    procs, result_conns, release_conns = [], [], []
    live_view = _LiveView(live and show_output)
    started = time.monotonic()
    succeeded = False
    try:
        for rank in range(world_size):
            result_recv, result_send = ctx.Pipe(duplex=False)
            release_recv, release_send = ctx.Pipe(duplex=False)
            spec = _WorkerSpec(
                rank=rank,
                world_size=world_size,
                master_port=port_holder.getsockname()[1],
                backend=backend,
                payload=payload,
                out_path=out_paths[rank],
                err_path=err_paths[rank],
                stack_path=stack_paths[rank],
                threads=threads,
                pg_timeout_s=timeout + 60,  # longer than ours: a hang surfaces here, with stacks
                parent_pid=os.getpid(),
            )
            proc = ctx.Process(target=_worker_main, args=(spec, result_send, release_recv), daemon=False)
            with warnings.catch_warnings():
                # Python 3.12+ warns on fork in a threaded process; the child replaces its
                # stdio at once and only runs our worker code, which is the safe pattern.
                warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
                proc.start()
            result_send.close()
            release_recv.close()
            procs.append(proc)
            result_conns.append(result_recv)
            release_conns.append(release_send)

        results = _wait_for_results(procs, result_conns, stack_paths, out_paths, timeout, started, live_view)
        succeeded = True
        for conn in release_conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"done")
        return results
    finally:
        _stop_workers(procs, grace_s=5.0 if succeeded else 0.0)
        live_view.close()
        for conn in result_conns + release_conns:
            conn.close()
        if show_output:
            _print_transcript(out_paths, err_paths, world_size)
        port_holder.close()
        for path in out_paths + err_paths + stack_paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        with contextlib.suppress(OSError):
            os.rmdir(workdir)


def _process_died(rank, proc, world_size) -> WorkerError:
    proc.join(1)
    reason = f"the worker process {_describe_exit(proc.exitcode)} before returning"
    return WorkerError(rank, "ProcessDied", reason, "", world_size)


def _wait_for_results(procs, result_conns, stack_paths, out_paths, timeout, started, live_view):
    world_size = len(procs)
    results = [None] * world_size
    pending = set(range(world_size))
    conn_rank = {id(conn): rank for rank, conn in enumerate(result_conns)}
    sentinel_rank = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    deadline = started + timeout
    while pending:
        watched = [result_conns[r] for r in pending] + [procs[r].sentinel for r in pending]
        for ready in wait_for_any(watched, timeout=0.1):
            rank = sentinel_rank[ready] if isinstance(ready, int) else conn_rank[id(ready)]
            if rank not in pending:
                continue
            if isinstance(ready, int):  # the process exited
                if result_conns[rank].poll():
                    continue  # a message (or end-of-pipe) is waiting: the pipe branch reads it
                raise _process_died(rank, procs[rank], world_size)
            try:
                message = pickle.loads(result_conns[rank].recv_bytes())
            except EOFError:  # the pipe closed with nothing in it: the process died
                raise _process_died(rank, procs[rank], world_size) from None
            if message[0] in (_RESULT_ERROR, _RESULT_UNSENDABLE):
                error_class = UnsendableResult if message[0] == _RESULT_UNSENDABLE else WorkerError
                _, exc_type, text, remote_tb = message
                raise error_class(rank, exc_type, text, remote_tb, world_size)
            results[rank] = cloudpickle.loads(message[1])
            pending.discard(rank)
        if pending and time.monotonic() > deadline:
            stacks = _collect_stacks(procs, pending, stack_paths)
            raise WorkerTimeout(timeout, stacks, set(range(world_size)) - pending, world_size)
        live_view.update(started, out_paths)
    return results
