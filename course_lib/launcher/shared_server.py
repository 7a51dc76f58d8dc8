"""One launch server for all of a user's kernels (Linux), not one per kernel.

Introduced with the class hub (docs/instructors.md, "Memory"). A launch server imports torch once
(about 0.4 GiB of memory of its own); with one per kernel, a learner with eight notebooks open held
eight. Here the first kernel that launches starts the server and every later kernel of the same user
(same Python, same course_lib, same import-time variables) forks its ranks from that one.

How it is kept:

* The server is CPython's forkserver (``multiprocessing.forkserver.main``), unchanged: a kernel sends
  it the rank's pipes and pickled spec, it forks the rank. The rank's working folder, ``sys.path``
  and environment travel with each launch, so it does not matter which kernel started the server.
* It listens on a Unix socket in a folder only this user may enter (``$XDG_RUNTIME_DIR`` where it is
  set, else a folder of the user's own in the temporary folder, refused if anyone else could write
  there): whoever can connect runs code as the user.
* Its "alive" pipe is a FIFO beside the socket. Every kernel that uses the server holds the FIFO
  open for writing (so does every rank, which inherits the kernel's copy); when the last one is gone,
  the server reads end-of-file and exits. Nobody has to stop it, and nothing of it outlives its users.
* It runs in a session of its own, so stopping one kernel (Jupyter signals the kernel's process
  group) does not stop the server the others use.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import select
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path


def private_folder() -> Path | None:
    """The folder of this user's launch servers, which only this user may enter; None if none is safe."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    candidates = [Path(runtime) / "course-launch"] if runtime else []
    candidates.append(Path(tempfile.gettempdir()) / f"course-launch-{os.getuid()}")
    for folder in candidates:
        if len(os.fsencode(folder / f"{'0' * 16}.alive")) > 100:  # a socket's path has at most 107 bytes
            continue
        with contextlib.suppress(OSError):
            folder.mkdir(mode=0o700, exist_ok=True)
            found = os.lstat(folder)
            if stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o077:
                return folder
    return None


def _where_this_process_runs() -> list:
    """Its cgroups and namespaces: a rank is forked from the server, and lands where the server is. A
    kernel in another cgroup (another Slurm job on the node, a test holding a kernel to a memory limit)
    or another namespace gets a server of its own, so its ranks are counted, limited and ended with it."""
    where = []
    with contextlib.suppress(OSError):
        where.append(Path("/proc/self/cgroup").read_text())
    for kind in ("net", "mnt", "pid", "user", "ipc"):
        with contextlib.suppress(OSError):
            where.append(os.stat(f"/proc/self/ns/{kind}").st_ino)
    return where


def server_key(preload: list[str], variables: dict[str, str | None]) -> str:
    """Kernels share a server only where it would import the same things the same way, and start
    ranks in the same cgroups and namespaces as their own."""
    import course_lib

    what = [os.path.realpath(sys.executable), os.path.dirname(course_lib.__file__), sys.version, preload,
            sorted(variables.items(), key=lambda item: item[0]), _where_this_process_runs()]
    return hashlib.sha256(repr(what).encode()).hexdigest()[:16]


def _reader_is_gone(fd: int) -> bool:
    """Whether the FIFO's reading end (the server) has closed: a pipe's writing end then polls POLLERR."""
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))


def join_server(folder: Path, key: str, preload: list[str]) -> tuple[str, int]:
    """The socket of the user's server for ``key`` and this process's hold on it (the FIFO's writing
    end, which keeps it running), starting the server if none runs."""
    launch, alive = folder / f"{key}.sock", folder / f"{key}.alive"
    with open(os.open(folder / f"{key}.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one kernel at a time decides whether to start it
        try:
            hold = os.open(alive, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # fails (ENXIO) if nobody reads
            if not _reader_is_gone(hold) and launch.exists():
                return str(launch), hold
            os.close(hold)
        except OSError:
            pass
        return str(launch), _start_server(folder, key, launch, alive, preload)


# The server's program: CPython's forkserver, in a process of its own that nobody waits for (it
# forks once, and its parent exits at once), removing its socket and FIFO when it ends, unless a newer
# server has made new ones under the same names meanwhile.
_SERVER = """
import os
if os.fork():
    os._exit(0)
made = {{path: os.stat(path).st_ino for path in {paths!r}}}
try:
    from multiprocessing.forkserver import main
    main({listener}, {reading}, {preload!r}, **{data!r})
finally:
    for path, inode in made.items():
        try:
            if os.stat(path).st_ino == inode and (not path.endswith(".log") or os.stat(path).st_size == 0):
                os.unlink(path)
        except OSError:
            pass
"""


def _start_server(folder: Path, key: str, launch: Path, alive: Path, preload: list[str]) -> int:
    for stale in (launch, alive):
        stale.unlink(missing_ok=True)
    os.mkfifo(alive, 0o600)
    reading = os.open(alive, os.O_RDONLY | os.O_NONBLOCK)
    hold = os.open(alive, os.O_WRONLY | os.O_CLOEXEC)
    log_path = folder / f"{key}.log"
    try:
        with socket.socket(socket.AF_UNIX) as listener, open(log_path, "ab") as log:
            listener.bind(str(launch))
            os.chmod(launch, 0o600)
            listener.listen(64)
            program = _SERVER.format(paths=[str(launch), str(alive), str(log_path)], listener=listener.fileno(),
                                     reading=reading, preload=preload,
                                     data={"sys_path": sys.path, "main_path": None})
            # One line of command, as CPython's own forkserver has: process listings (ps, py-spy) show it whole.
            subprocess.run([sys.executable, "-c", f"exec({program!r})"], pass_fds=(listener.fileno(), reading), check=True,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/",
                           timeout=60)
    except BaseException:
        os.close(hold)
        raise
    finally:
        os.close(reading)
    return hold


@functools.cache
def shared_fork_server_class():
    from multiprocessing import forkserver, resource_tracker

    class SharedForkServer(forkserver.ForkServer):
        """CPython's ForkServer, pointed at the user's shared server instead of one of its own."""

        folder: Path
        key: str  # which server this kernel wants now (server_key)
        joined: str | None = None  # which server it holds

        def ensure_running(self):
            with self._lock:
                resource_tracker.ensure_running()
                held = self._forkserver_alive_fd
                if held is not None and self.joined == self.key and not _reader_is_gone(held):
                    return
                self._let_go()
                self._forkserver_address, self._forkserver_alive_fd = join_server(self.folder, self.key,
                                                                                  self._preload_modules)
                self.joined = self.key

        def connect_to_new_process(self, fds):
            for attempt in (1, 2):
                self.ensure_running()
                try:
                    return self._connect(fds)
                except (ConnectionRefusedError, FileNotFoundError):
                    if attempt == 2:
                        raise
                    with self._lock:  # it exited just as this kernel joined (its last user had gone)
                        self._let_go()

        def _connect(self, fds):
            """CPython's connect_to_new_process, which first makes sure the server is this user's: the
            pickled rank (its function, its environment) goes to nobody else."""
            from multiprocessing import reduction

            if len(fds) + 4 >= forkserver.MAXFDS_TO_SEND:
                raise ValueError("too many fds")
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(self._forkserver_address)
                credentials = client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                owner = struct.unpack("3i", credentials)[1]
                if owner != os.getuid():
                    raise PermissionError(f"the launch server at {self._forkserver_address} is user {owner}'s, not "
                                          f"yours: remove {self.folder} (only you should be able to write there)")
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                try:
                    reduction.sendfds(client, [child_r, child_w, self._forkserver_alive_fd,
                                               resource_tracker.getfd(), *fds])
                    return parent_r, parent_w
                except BaseException:
                    os.close(parent_r)
                    os.close(parent_w)
                    raise
                finally:
                    os.close(child_r)
                    os.close(child_w)

        def _let_go(self):
            if self._forkserver_alive_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._forkserver_alive_fd)
            self._forkserver_address = self._forkserver_alive_fd = self._forkserver_pid = self.joined = None

        def _stop(self):  # (a kernel whose import-time variables changed: it joins another server)
            with self._lock:
                self._let_go()

    return SharedForkServer
