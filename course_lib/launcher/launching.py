"""``launch``: run one function on N real ``torch.distributed`` worker processes.

Introduced in chapter 00 (preflight), used by every chapter after it. What the parent process
does, in order:

1. reserve a free port the operating system picks and hold it for the whole
   launch, so concurrent launches never fight over a port (rank 0 hosts the
   rendezvous store on it, as with ``torchrun``);
2. start the workers (server.py says how, and why) with ``fn`` sent by value
   (cloudpickle), so functions defined in a notebook cell work;
3. wait for each rank's result, a failing rank, a dead rank or the timeout (wait.py);
4. on any failure stop every worker (and the workers' own children);
5. print each rank's output in rank order, prefixed ``[rank r]`` (output.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import warnings

from .devices import _placement_line, choose_backend, threads_per_rank
from .live import _LiveView
from .output import _Drain, _launch_folder, _print_transcript, _rank_paths, _remove_rank_files
from .protocol import _InheritedFd, _Judged, _serialise_call, _WorkerSpec
from .sandbox_server import _sandbox_context
from .server import _choose_start_method, _server_context, _without_main_module_import
from .wait import _MAX_STRETCH, _Waiter
from .worker import _worker_main


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
    live: in a notebook, show the ranks' progress while they run (with ``show_output=False``, how long they
        have run and their progress bars, not their lines).

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
            show_output, live, startup_timeout, judged: _Judged | None = None, nodes: list | None = None):
    """launch() itself; with ``judged``, also each rank's measurements (see measuring._Meter.measure).
    ``nodes``: per rank, the emulated node it joins (course_lib.emulated_cluster)."""
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
    ctx = _start_context(method, sandbox)
    workdir, held = _launch_folder(judged=judged is not None)
    if judged is not None and judged.run_as is not None:
        _make_learner_home(judged, workdir)
    paths = _rank_paths(workdir, world_size)
    port_holder = _reserve_port()  # 30 learners launching at once on one server never collide
    ranks = _Ranks(ctx, judged)
    live_view = _LiveView(live, world_size, show_lines=show_output)  # quiet ranks still show they are running
    loopback_before = sandbox.loopback_bytes() if sandbox is not None else None
    succeeded = False
    try:
        shared = _shared_spec(world_size, port_holder.getsockname()[1], backend, threads,
                              timeout, startup_timeout, judged)
        for rank in range(world_size):
            ranks.start(rank, payloads[rank], paths, shared, node=None if nodes is None else nodes[rank])
        waiter = _Waiter(ranks.procs, ranks.result_conns, paths, live_view, judged=judged, drains=ranks.drains,
                         loopback_before=loopback_before)
        results = waiter.wait(timeout, startup_timeout)
        succeeded = True
        ranks.release()
        live_view.finish(paths["progress"])
        return results, waiter.measurements
    finally:
        ranks.stop(grace_s=5.0 if succeeded else 0.0)
        live_view.close()
        ranks.close_pipes()
        if show_output:
            _show_output(world_size, backend, paths)
        port_holder.close()
        _remove_rank_files(workdir, paths, judged=judged is not None, held=held)


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


def _start_context(method: str, sandbox):
    """Where the ranks start from: the sandbox's own server (grading), the kernel's launch server,
    or a plain multiprocessing context (spawn, fork)."""
    if sandbox is not None:
        return _sandbox_context(sandbox)
    return _server_context() if method == "forkserver" else mp.get_context(method)


def _make_learner_home(judged: _Judged, workdir: str) -> None:
    """A grader running as root: the unprivileged learner's HOME and TMPDIR, in the launch's folder."""
    home = os.path.join(workdir, "home")
    os.mkdir(home, 0o700)
    os.chown(home, judged.run_as[0], judged.run_as[1])
    judged.run_as = (judged.run_as[0], judged.run_as[1], home)


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


def _shared_spec(world_size, master_port, backend, threads, timeout, startup_timeout, judged) -> dict:
    """What every rank's _WorkerSpec holds alike."""
    sandbox = judged.sandbox if judged is not None else None
    environment = dict(os.environ) if judged is None or judged.environment is None else dict(judged.environment)
    return dict(
        world_size=world_size,
        master_port=master_port,
        backend=backend,
        threads=threads,
        # longer than ours: a hang surfaces here, with stacks, not as a gloo timeout
        pg_timeout_s=_MAX_STRETCH * (startup_timeout + timeout) + 60,
        kernel_pid=None if sandbox is not None else os.getpid(),
        environment=environment,
        cwd=judged.cwd if judged is not None and judged.cwd else os.getcwd(),
        sys_path=list(sys.path),
        judged=judged,
    )


class _Ranks:
    """The processes of one launch, and the pipes to and from each: started, released, stopped."""

    def __init__(self, ctx, judged: _Judged | None):
        self.ctx, self.judged = ctx, judged
        self.procs, self.result_conns, self.release_conns = [], [], []
        self.drains: list[_Drain] = []

    def start(self, rank: int, payload: bytes, paths: dict, shared: dict, node: dict | None = None) -> None:
        result_recv, result_send = self.ctx.Pipe(duplex=False)
        release_recv, release_send = self.ctx.Pipe(duplex=False)
        rank_drains, output_fds = [], None
        if self.judged is not None:  # what a rank prints reaches the judge through pipes it drains and counts
            rank_drains = [_Drain(paths[kind][rank]) for kind in ("out", "err", "stack")]
            self.drains += rank_drains
            output_fds = tuple(_InheritedFd(drain.write_fd) for drain in rank_drains)
        spec = _WorkerSpec(rank=rank, payload=payload, out_path=paths["out"][rank], err_path=paths["err"][rank],
                           stack_path=paths["stack"][rank], progress_path=paths["progress"][rank],
                           output_fds=output_fds, node=node, **shared)
        proc = self.ctx.Process(target=_worker_main, args=(spec, result_send, release_recv), daemon=False)
        with warnings.catch_warnings(), _without_main_module_import():
            # Python 3.12+ warns on fork in a threaded process; the child replaces its
            # stdio at once and only runs our worker code, which is the safe pattern.
            warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
            proc.start()
        result_send.close()
        release_recv.close()
        for drain in rank_drains:
            drain.started()
        self.procs.append(proc)
        self.result_conns.append(result_recv)
        self.release_conns.append(release_send)

    def release(self) -> None:
        """Every rank has returned: let them all exit."""
        for conn in self.release_conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(b"done")

    def stop(self, grace_s: float) -> None:
        """Wait up to grace_s for workers to exit, then kill each one's whole process group."""
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.pid is None:
                continue
            for kill in (os.killpg, os.kill):  # the group takes the worker's own children too
                with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                    kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.join(5)
        for drain in self.drains:
            drain.close()

    def close_pipes(self) -> None:
        for conn in self.result_conns + self.release_conns:
            conn.close()


def _show_output(world_size, backend, paths) -> None:
    placement = _placement_line(world_size, backend)
    if placement:
        print(placement)
    _print_transcript(paths["out"], paths["err"], world_size)
