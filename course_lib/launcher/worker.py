"""What runs in each rank: ``_worker_main``, from the moment the process starts to its exit.

Introduced in chapter 00 (preflight). A rank becomes what torchrun would make of it (the
torchrun variables, the notebook's environment, directory and import path), joins the process
group, runs fn, and sends its frames back (protocol.py); it then waits until every rank has
finished, so that an early exit never turns a peer's hang into a "connection closed" error.
A judged rank (course_lib.grading) first runs the learner's cells, may drop privileges or be
kept apart from the other ranks, and sends its result as plain data.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import io
import multiprocessing as mp
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
from datetime import timedelta

import cloudpickle

from ..confine.out_of_memory import prefer_as_victim
from .devices import _SEES_ALL_GPUS_VARIABLE, rank_gpu
from .live import _PROGRESS_FILE_VARIABLE
from .measuring import _resident_bytes
from .protocol import (_RESULT_BASELINE, _RESULT_ERROR, _RESULT_OK, _RESULT_STARTED, _RESULT_UNSENDABLE,
                       _STACK_SIGNAL, _dumps, _fd_of, _report, _WorkerSpec, tensors_in,
                       too_large)

# A rank's traceback starts at the learner's code: the frames of this package are left out.
_PACKAGE_FOLDER = os.path.dirname(__file__)
PRELUDE_ERRORS: list = []  # in a judged worker: (cell label, exception type, message) per failing cell


def _worker_main(spec: _WorkerSpec, result_conn, release_conn) -> None:
    """Entry point of every worker process (forkserver, spawn or fork)."""
    _become_a_rank(spec, result_conn)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(spec.threads)
    with contextlib.suppress(Exception):  # read at import; the notebook may have set it since
        dist.set_debug_level_from_env()
    try:
        fn, args, kwargs = _enter_fn(spec, result_conn)
        result = _call_user_function(fn, args, kwargs)
    except BaseException as exc:  # noqa: BLE001 - report everything, SystemExit included
        sys.stdout.flush()
        sys.stderr.flush()
        _report(result_conn, (_RESULT_ERROR, type(exc).__name__, _message_of(exc), _frames_of(exc)))
        os._exit(1)
    _send_result(spec, result_conn, result)
    # Stay alive until every rank has finished: a rank that exits early would turn the
    # others' pending collectives into "connection closed" errors instead of a visible hang.
    with contextlib.suppress(EOFError, OSError):
        release_conn.recv_bytes()
    if spec.backend is not None and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _become_a_rank(spec: _WorkerSpec, result_conn) -> None:
    """Everything before torch: this process's output, environment, user, and its tie to the kernel."""
    if spec.node is not None:
        _join_node(spec, result_conn)  # while this process has one thread, as setns requires
    os.setpgrp()  # own process group: Ctrl-C in a terminal reaches only the parent, which stops us
    prefer_as_victim()  # out of memory, a rank dies before the notebook's kernel (course_lib.confine.out_of_memory)
    _redirect_stdio(spec.out_path, spec.err_path, spec.output_fds)
    _dump_stacks_on_signal(spec)
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


def _join_node(spec: _WorkerSpec, result_conn) -> None:
    """Enter an emulated node's user and network namespaces (course_lib.confine.emulated_network)."""
    from ..confine.namespaces import enter

    try:
        enter(spec.node["user_namespace"], spec.node["net_namespace"])
    except OSError as exc:
        _report(result_conn, (_RESULT_ERROR, "LaunchError", f"rank {spec.rank} could not join emulated node "
                              f"{spec.node['node']} ({exc}); is the cluster still open?", []))
        os._exit(1)


def _enter_fn(spec: _WorkerSpec, result_conn):
    """Up to the moment fn can run: the learner's cells (judged), fn itself, the process group."""
    if spec.judged is not None:
        # Counted before the learner's code: what starting the interpreter wrote (spawn's
        # fresh Python runs `ldconfig -p`, and a reaped child's writes count as the parent's).
        # Also its resident memory: what a check's memory rule measures growth from.
        _report(result_conn, (_RESULT_BASELINE, _bytes_written_so_far(spec), _resident_bytes(os.getpid())))
        _run_prelude(spec.judged.prelude)
    fn, args, kwargs = cloudpickle.loads(spec.payload)
    if spec.backend is not None:
        _join_process_group(spec)
    _report(result_conn, (_RESULT_STARTED,))
    return fn, args, kwargs


def _join_process_group(spec: _WorkerSpec) -> None:
    import torch
    import torch.distributed as dist

    if "nccl" in spec.backend and rank_gpu() is not None:
        torch.cuda.set_device(rank_gpu())
    dist.init_process_group(spec.backend, timeout=timedelta(seconds=spec.pg_timeout_s))


def _call_user_function(fn, args, kwargs):
    return fn(*args, **kwargs)


def _send_result(spec: _WorkerSpec, result_conn, result) -> None:
    """fn's result to the parent: cloudpickle for lessons, torch.save data when judged."""
    if spec.judged is not None and _tensor_bytes(result) > spec.judged.max_result_bytes:
        # Refused at once: copying hundreds of MiB into torch.save's buffer takes seconds on a busy
        # machine, and the parent refuses the result anyway once it reads past its limit.
        _report(result_conn, (_RESULT_ERROR, "ResultTooLarge", too_large(spec.judged.max_result_bytes), []))
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


def _tensor_bytes(result) -> int:
    """The bytes of the tensors' storages in a result (each storage once), as torch.save writes them."""
    storages = {}
    for tensor in tensors_in(result):
        with contextlib.suppress(Exception):  # a tensor without storage (meta, sparse) counts nothing
            storage = tensor.untyped_storage()
            storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
    return sum(storages.values())


def _data_payload(result) -> bytes:
    """The result as torch.save bytes; the parent accepts them only as plain data (protocol._load_data)."""
    import torch

    buffer = io.BytesIO()
    torch.save(result, buffer)
    return buffer.getvalue()


def _message_of(exc: BaseException) -> str:
    """str(exc), or why there is none: an exception whose __str__ raises is still reported as itself."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 - whatever it raises, the rank's own error is what counts
        return f"(its message could not be read: str() raised {type(inner).__name__})"


def _frames_of(exc: BaseException) -> list[tuple]:
    """The traceback from the learner's function down, as plain tuples the parent formats.

    The parent fills in source lines and names notebook cells: it has the kernel's
    cell files, which a worker started from a server or by spawn does not.
    """
    return [(f.filename, f.lineno, f.name, f.line or "")
            for f in traceback.extract_tb(exc.__traceback__) if os.path.dirname(f.filename) != _PACKAGE_FOLDER]


# --------------------------------------------------------------------------
# Becoming a rank
# --------------------------------------------------------------------------
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


def _dump_stacks_on_signal(spec: _WorkerSpec) -> None:
    """On _STACK_SIGNAL, write every thread's stack where the parent reads it (reports._collect_stacks)."""
    if _STACK_SIGNAL is None:
        return
    if spec.output_fds is not None:
        stack_file = os.fdopen(_fd_of(spec.output_fds[2]), "w")
    else:
        stack_file = open(spec.stack_path, "w")
    faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True)


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
    if spec.node is not None:  # an emulated node: its own address, the first node's store, its rank in the node
        os.environ.update(MASTER_ADDR=spec.node["master_addr"], GLOO_SOCKET_IFNAME=spec.node["interface"],
                          LOCAL_RANK=str(spec.node["local_rank"]), LOCAL_WORLD_SIZE=str(spec.node["local_world_size"]),
                          GROUP_RANK=str(spec.node["node"]))
    elif loopback:  # one machine: keep gloo on loopback, whatever the hostname resolves to
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)


def _loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


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


# --------------------------------------------------------------------------
# A judged rank (course_lib.grading): the learner's code, held to the grader's rules
# --------------------------------------------------------------------------
def _drop_privileges(run_as) -> None:
    """A grader running as root: the learner's code runs as an unprivileged user."""
    uid, gid, home = run_as
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.environ.update(HOME=home, TMPDIR=home)
    tempfile.tempdir = None


def _keep_apart(apart: dict) -> None:
    """Graded in a sandbox: this rank reaches the others only over the network (course_lib.confine.apart).
    Its working directory, TMPDIR and HOME become a folder of its own, in the sandbox's own /tmp (its
    limits on bytes and files hold there). Named, not found with tempfile.gettempdir(): that probes by
    writing, and with /tmp full it falls back to the working directory, the scratch folder on the host's disk."""
    from ..confine.apart import deny_side_sockets, keep_rank_apart, sessions_become_process_groups

    private = os.path.join(apart["private_root"], f"rank-{os.getpid()}")
    keep_rank_apart(private, list(apart["shared"]), list(apart["readable"]))
    deny_side_sockets()
    sessions_become_process_groups()
    os.chdir(private)
    os.environ.update(TMPDIR=private, HOME=private)
    tempfile.tempdir = None


def _run_prelude(prelude) -> None:
    """Run the learner's cells (setup first) in a fresh __main__, as a kernel would."""
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
