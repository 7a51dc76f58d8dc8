"""A grading sandbox's own launch server: the learner side of a judged launch starts inside the
submission's sandbox (course_lib.grading.sandbox), never from a process outside it.

Not a chapter's: grading (course_lib.grading.judge) adds it to chapter 00's launcher.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import threading

from .errors import LaunchError
from .server import _SERVER_PRELOAD, _server_lock

_starter: dict = {}  # the thread that starts sandboxes for launches made from other threads


def _sandbox_context(sandbox):
    """A context whose processes start from a launch server of their own inside ``sandbox`` (grading).

    Its own server, not the kernel's: the judge's plain launches (references) keep theirs, and
    nothing of the learner side is ever forked from a process outside the sandbox.
    """
    with _server_lock:
        if sandbox.server is None:
            if sandbox.pid is not None:  # its server was started once and is gone: so is everything in it
                raise _sandbox_ended(sandbox)
            _start_server_inside(sandbox)

    class Context:
        Pipe = staticmethod(mp.Pipe)

        @staticmethod
        def Process(**kwargs):
            proc = _SandboxProcess(**kwargs)
            proc._sandbox = sandbox
            return proc

    return Context


def _start_server_inside(sandbox) -> None:
    from multiprocessing import resource_tracker, spawn

    resource_tracker.ensure_running()  # the judge's own, outside: started before the swap below
    server = _sandbox_fork_server_class()(sandbox)
    server.set_forkserver_preload(_SERVER_PRELOAD)
    plain = spawn.get_executable()
    try:
        spawn.set_executable(sandbox.executable())
        _in_a_lasting_thread(server.ensure_running)
    finally:
        spawn.set_executable(plain)
    sandbox.started(server._forkserver_pid, server)


def _sandbox_ended(sandbox) -> LaunchError:
    return LaunchError(f"the learner side's sandbox has ended: {sandbox.ended_because or 'it exited'}")


def _in_a_lasting_thread(start) -> None:
    """Run ``start()`` (which forks the sandbox's first process) in a thread that lives as long as the
    judge: bwrap's --die-with-parent kills the sandbox when the *thread* that forked it ends (the
    kernel's parent-death signal follows the thread), so a launch from a short-lived thread would
    leave a sandbox that dies with that thread."""
    if threading.current_thread() is threading.main_thread():
        start()
        return
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


def _sandbox_fork_server_class():
    from multiprocessing import forkserver

    class SandboxForkServer(forkserver.ForkServer):
        """The sandbox's launch server: started once, inside, and never again.

        CPython's ForkServer starts a new server whenever the last one has exited (the OOM killer
        picked it, say), with the plain executable: that one would run outside the sandbox, as the
        judge, and fork the next rank there. This one refuses instead. And every process CPython's
        server forks is handed its starter's resource-tracker pipe: the judge's tracker, outside,
        which unlinks what a line names in the host's /dev/shm and prints on the judge's stderr.
        The ranks get a pipe to /dev/null in its place (what they create lives in the sandbox's
        own /dev/shm, which ends with it)."""

        def __init__(self, sandbox):
            super().__init__()
            self.sandbox = sandbox

        def ensure_running(self):
            if self._forkserver_pid is None:
                return super().ensure_running()  # the first start, inside (see _start_server_inside)
            exited = os.waitid(os.P_PID, self._forkserver_pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if exited is not None:  # not reaped here: Sandbox.end waits for it
                raise _sandbox_ended(self.sandbox)

        def connect_to_new_process(self, fds):
            nowhere = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                with _tracker_swap_lock:  # CPython reads forkserver.resource_tracker.getfd() in the call
                    judges = forkserver.resource_tracker
                    forkserver.resource_tracker = _TrackerLeadingNowhere(judges, nowhere)
                    try:
                        return super().connect_to_new_process(fds)
                    finally:
                        forkserver.resource_tracker = judges
            finally:
                os.close(nowhere)  # sent already: the rank has its own copy

    return SandboxForkServer


_tracker_swap_lock = threading.Lock()


class _TrackerLeadingNowhere:
    """multiprocessing.resource_tracker, but getfd() is a pipe to /dev/null (see SandboxForkServer).
    Another thread starting the judge's own processes meanwhile would hand them /dev/null too:
    harmless (their shared memory would go untracked), and never the other way round."""

    def __init__(self, module, fd):
        self._module, self._fd = module, fd

    def getfd(self):
        return self._fd

    def __getattr__(self, name):
        return getattr(self._module, name)


class _SandboxProcess(mp.process.BaseProcess):
    """A worker started by a grading sandbox's own launch server (see _sandbox_context)."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj):
        return _SandboxPopen(process_obj)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_sandbox", None)  # the judge's object, never the worker's
        # The worker becomes this object (its current_process()): a key of its own, not the judge's.
        state["_config"] = dict(state["_config"], authkey=mp.process.AuthenticationString(os.urandom(32)))
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
        prep_data["authkey"] = os.urandom(32)  # the judge's own key (multiprocessing's) stays with the judge
        prep_data["sys_argv"] = prep_data["sys_argv"][:1]  # a kernel's arguments name its connection file
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        server = sandbox.server  # read once: Sandbox.end, in another thread, sets it to None
        if server is None:
            raise _sandbox_ended(sandbox)
        self.sentinel, w = server.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = sandbox.outside_pid(forkserver.read_signed(self.sentinel))  # the server knows only the pid inside
        sandbox.rank_pids.add(self.pid)  # never a "helper", in this launch or, still exiting, in the next
