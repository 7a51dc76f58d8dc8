"""How the ranks start: the launch server (Python's forkserver with torch preloaded), or spawn.

Introduced in chapter 00 (preflight), which says what a fresh kernel's first launch waits for
(the server importing torch once).

How workers start, and why
--------------------------
A worker forked straight from the notebook kernel inherits the kernel's OpenMP
thread pool, and GNU OpenMP's pool does not survive ``fork``: once the kernel has
run any multi-threaded tensor op, a forked worker that uses more than one
intra-op thread hangs in its first parallel op (pytorch#41197, #58962). A 2-core
machine never sees it (2 ranks get one thread each); a 4-core laptop always does.
``spawn`` avoids it but starts a fresh interpreter per rank per launch (about 5 s
for 4 ranks on 2 cores, 14 s from a notebook). So, on Linux, workers are forked
from a *launch server*: a fresh interpreter (Python's ``forkserver``) that imports torch and
never runs a tensor op or touches CUDA, started once and shared by all of a user's kernels
(shared_server.py says how; a grading judge keeps one of its own).
Its children start in milliseconds with torch already imported, may use as many
threads as they like, and may use CUDA even when the kernel already has.

Because a server child does not inherit the kernel's memory, the launch sends
what a learner expects a worker to see: ``fn`` and its arguments by value, the
kernel's environment variables *at the moment of the launch* (e.g.
``TORCH_DISTRIBUTED_DEBUG`` set in a cell), its working directory and
``sys.path``. Variables that torch reads only when it is imported (such as
``TORCH_CPP_LOG_LEVEL``) get a server of their own when they change.

The server starts in the background as soon as the kernel starts (``make`` installs a kernel
setting that calls ``warm_up()``), or else when course_lib is imported: measured on 2 cores,
a learner's first launch then takes about 0.9 s instead of 2.1 s, and later ones 0.15 s.

macOS and Windows use ``spawn`` (Python's own default there: system libraries
are not fork-safe); ``COURSE_START_METHOD=spawn`` forces it anywhere, which the
test suite uses to check that a notebook reads the same on every platform.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import threading

# What the launch server imports once, so that its children start warm. torch._dynamo
# is what DDP imports on first use: 2.5 s per worker on 2 cores if every worker pays it.
_SERVER_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "course_lib.launcher"]
# Read by torch (or its C++ core) only at import: a change needs a fresh server.
_IMPORT_TIME_VARIABLES = ("TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS",
                          "OMP_WAIT_POLICY", "KMP_AFFINITY", "GOMP_SPINCOUNT")

_server_variables: dict[str, str | None] | None = None
_server_owner: int | None = None  # the process that started the server
_server_lock = threading.Lock()


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
        _check_fork_is_safe(threads)
    return requested


def _check_fork_is_safe(threads) -> None:
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


def _import_time_variables() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in _IMPORT_TIME_VARIABLES}


def _server_context():
    """The forkserver context, with a server whose torch saw this kernel's import-time variables:
    the user's shared one (shared_server.py) where it can be, else one of this process's own."""
    global _server_variables, _server_owner
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    with _server_lock:
        server = forkserver._forkserver
        if _server_owner is not None and _server_owner != os.getpid():
            # A process forked from one that ran launches (e.g. a learner's forked helper):
            # the server (or the hold on the shared one) belongs to the parent; get our own.
            server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None
            server.joined = None  # (the shared server's hold, where there is one: see shared_server.py)
        _server_owner = os.getpid()
        wanted = _import_time_variables()
        if _server_variables is not None and _server_variables != wanted:
            with contextlib.suppress(Exception):
                server._stop()  # next start picks up the new variables
        ctx.set_forkserver_preload(_SERVER_PRELOAD)
        _server_variables = wanted
        _share_where_possible(server, wanted)
        server.ensure_running()
    return ctx


def _share_where_possible(server, variables) -> None:
    """Point CPython's fork server at the user's shared launch server (shared_server.py), keyed by what
    the server imports and how. Not in grading, whose judges keep a server each, as they always have."""
    from multiprocessing import forkserver

    from .shared_server import private_folder, server_key, shared_fork_server_class

    if os.environ.get("COURSE_GRADING") == "1":
        return
    folder = private_folder()
    if folder is None:  # nowhere only this user can enter: a server of this process's own
        return
    shared = shared_fork_server_class()
    if not isinstance(server, shared):
        if server._forkserver_pid is not None:
            with contextlib.suppress(Exception):
                server._stop()
        server.__class__ = shared
        # CPython's module-level functions are bound to the object as it was made: rebind them.
        forkserver.ensure_running = server.ensure_running
        forkserver.connect_to_new_process = server.connect_to_new_process
    server.folder, server.key = folder, server_key(_SERVER_PRELOAD, variables)


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


def _importing_in_launch_server() -> bool:
    """True while the launch server imports its preload (course_lib.launcher is the last of it)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


def _freeze_the_preload() -> None:
    """Called once the launch server has imported all of course_lib.launcher.

    Every rank is a copy-on-write fork of the server. Python's garbage collector writes to each
    object it examines, so a rank's first full collection would copy most of the pages holding
    the preloaded modules' objects into the rank's own memory. Frozen, they are never examined.
    (Thawed when the server itself exits, so that its shutdown still frees them: nanobind
    modules complain about objects left alive at exit. Ranks leave by os._exit.)
    """
    import atexit
    import gc

    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)
