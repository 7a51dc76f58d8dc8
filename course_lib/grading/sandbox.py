"""The sandbox a submission's code runs in while it is graded (Linux, bubblewrap).

Introduced with the graded exercises (chapter 01 on). ``scripts/grade.py`` grades every
submission with its learner side (the launch server and every rank it forks) inside a
sandbox that holds nothing of any other submission, made by bubblewrap (``bwrap``, Debian's ``bubblewrap``: the tool Flatpak
confines its applications with). Inside:

* its own **user namespace**: the code runs as uid 65534 with no capabilities;
* its own **pid namespace**: it sees only its own processes, cannot signal the judge, and
  everything in it (a detached, double-forked daemon too) is killed before the judge moves on to
  the next submission, and dies when the judge exits (``--die-with-parent``);
* its own **network namespace**: a loopback of its own where the ranks talk; the judge's
  kernel, other submissions' ranks and every port of the host are out of reach;
* its own **mount namespace**: the Python environment and ``course_lib`` read-only, a private
  ``/tmp`` and ``/dev/shm`` (each a tmpfs of its own, in memory, that no other process of the
  machine sees) and a scratch folder, and nothing else: no solutions, no other submission, no
  grades, no notebook holding hidden tests, no connection file of a kernel;
* **limits**: processes (a cgroup's ``pids.max`` when the grader is root, else
  ``RLIMIT_NPROC``, which the kernel does not enforce for root), memory (the cgroup's limit, or a
  watchdog in the judge that ends the sandbox), CPU seconds and file size per process, and what its
  ``/tmp`` and ``/dev/shm`` hold (bytes: the tmpfs's size; files: the watchdog). Nothing the
  learner side writes reaches the host's disk (the ranks write only below ``/tmp``: course_lib.confine.apart);
* inside it, **each rank apart** from the others and from the launch server (course_lib.confine.apart:
  a Landlock domain of its own and a seccomp filter): what one rank knows reaches another only over TCP.

A judge that grades several submissions in turn keeps its sandbox and empties it between two
(``empty_for_the_next_submission``: every process but bwrap, its init and the launch server killed,
every writable folder emptied), so the launch server's import of PyTorch is paid once per judge.
That holds nothing of the last submission because its ranks could not change the launch server
(no tracing or signals across Landlock domains, ABI 6) nor leave IPC objects; on an older Landlock,
every submission gets a new sandbox.

The judge talks to the sandbox only over what it hands in: the launch server's listening
socket and, per rank, the pipes of its result, its release and its output. It measures from
outside what the rules count (``SandboxRun``): bytes on the sandbox's own loopback, memory of
every process in it.

Why bubblewrap: it is small, audited, packaged by every distribution, runs without root (unlike
nsjail's cgroup and network set-up, or ``unshare`` plus hand-made mounts), and it is what
Flatpak and many graders' "run as another user in a throwaway root" advice come down to on
one machine. What it needs: the ``bwrap`` program and unprivileged user namespaces (on by
default on Debian and Fedora; Ubuntu 24.04 allows bwrap through its AppArmor profile).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ..confine.cgroups import Cgroups, cgroup_roots
from .sandbox_folders import empty_folder, holds_a_mount_point
from .sandbox_watch import WatchedFromOutside

__all__ = ["Sandbox", "SandboxUnavailable", "sandbox_problem", "INSTALL_HINT"]

INSIDE_UID = 65534
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`, Fedora: `sudo dnf install "
                "bubblewrap`) and make sure unprivileged user namespaces are allowed (`sysctl "
                "kernel.unprivileged_userns_clone=1` on older Debian kernels); or grade only your own notebook, "
                "unconfined, with --no-sandbox")
MEMORY_LIMIT_BYTES = 8 << 30  # a whole submission's processes together (chapter 11: 8 ranks of ~350 MB)
PROCESS_LIMIT = 1024  # tasks: threads count too (a rank runs a dozen or more)
FILE_SIZE_LIMIT_BYTES = 1 << 30
# What the sandbox's /tmp (every rank's own folder) and /dev/shm may each hold: bytes and files.
# The chapters' solutions keep a few MB there at most (a profiler's trace, a checkpoint).
TMPFS_LIMIT_BYTES = 2 << 30
TMPFS_LIMIT_FILES = 100_000
CPU_SECONDS_LIMIT = 3600
# Kernel memory in the sandbox's sockets (queues of TCP, Unix and netlink sockets), which no memory limit of
# its processes sees: gloo's connections hold a few MB each at most; a submission that fills the queues of
# thousands of sockets nobody reads is ended here.
SOCKET_MEMORY_LIMIT_BYTES = 1 << 30
_REPO = Path(__file__).resolve().parents[2]
_COURSE_LIB = _REPO / "course_lib"


def _name_prefix() -> str:
    """Folders and cgroups are named after the grading run, so grade.py can remove what a killed judge left."""
    return f"course-grading-{os.environ.get('COURSE_GRADING_RUN', 'local')}-"


def remove_leftovers(run: str) -> None:
    """Remove the sandbox folders and cgroups of one grading run (their judges were killed)."""
    prefix = f"course-grading-{run}-"
    roots = [Path(tempfile.gettempdir())]
    found = cgroup_roots() if os.geteuid() == 0 else None
    roots += list((found or {}).values())
    for root in roots:
        for folder in root.glob(prefix + "*"):
            if (folder / "cgroup.procs").exists():
                with contextlib.suppress(OSError):
                    folder.rmdir()
            else:
                shutil.rmtree(folder, ignore_errors=True)


class SandboxUnavailable(RuntimeError):
    """This machine cannot make the sandbox; the message says what is missing and how to get it."""


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def _prlimit() -> str:
    return shutil.which("prlimit") or "/usr/bin/prlimit"


def _setsid() -> str:
    return shutil.which("setsid") or "/usr/bin/setsid"


def sandbox_problem() -> str | None:
    """Why a sandbox cannot be made here (None when it can): tried for real, once."""
    if not sys.platform.startswith("linux"):
        return f"the grading sandbox needs Linux (this is {sys.platform}); grade on a Linux machine or with --no-sandbox"
    if _bwrap() is None:
        return f"the program `bwrap` was not found: {INSTALL_HINT}"
    if shutil.which("prlimit") is None and not os.path.exists("/usr/bin/prlimit"):
        return "the program `prlimit` (util-linux) was not found: install util-linux"
    probe = subprocess.run([_bwrap(), "--unshare-all", "--die-with-parent", "--uid", str(INSIDE_UID),
                            "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"bwrap could not make a sandbox ({probe.stderr.strip() or probe.returncode}): {INSTALL_HINT}"
    from ..confine import apart

    if apart.landlock_abi() < 1:  # each rank keeps itself apart from the others with it (apart.py)
        return ("this kernel offers no Landlock (Linux 5.13 or later with landlock among its security modules, "
                "see /sys/kernel/security/lsm; add it with the boot parameter lsm=landlock,...): without it the "
                "ranks of one launch could share files and read each other's memory. Grade on such a kernel, "
                "or with --no-sandbox")
    if os.geteuid() == 0 and cgroup_roots() is None:
        return ("the grader runs as root, and the kernel does not limit the processes of root (RLIMIT_NPROC) "
                "while no cgroup hierarchy with the pids and memory controllers is writable here: run the grader as "
                "an ordinary user, or mount cgroups (/sys/fs/cgroup)")
    return None


# --------------------------------------------------------------------------
# The sandbox
# --------------------------------------------------------------------------
def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited (left unreaped: Sandbox.end waits for it)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _tasks_of_user(uid: int) -> int:
    """How many tasks (threads) processes of real user ``uid`` run now: what RLIMIT_NPROC counts."""
    total = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = dict(line.split(":", 1) for line in Path(entry.path, "status").read_text().splitlines()
                              if line.startswith(("Uid:", "Threads:")))
                if int(fields["Uid"].split()[0]) == uid:
                    total += int(fields["Threads"])
    return total


def _read_only_paths() -> list[str]:
    """What the learner side must read: the system's libraries, Python, its packages, course_lib."""
    repo = str(_REPO)
    paths = {"/usr", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
             "/etc/localtime", "/etc/alternatives", "/sys",
             sys.base_prefix, sys.prefix, str(_COURSE_LIB)}
    # Never a folder that holds the sandboxes' own (a judge started from a script in /tmp has /tmp on
    # its path): a submission would see the scratch folders of the others being graded beside it.
    sandboxes = os.path.realpath(tempfile.gettempdir())
    for entry in sys.path:  # site-packages and the like; nothing of the course's folder but course_lib
        if entry and os.path.isabs(entry) and os.path.isdir(entry):
            inside_repo = entry == repo or entry.startswith(repo + os.sep)
            holds_sandboxes = (sandboxes + os.sep).startswith(os.path.realpath(entry).rstrip(os.sep) + os.sep)
            if (not inside_repo or entry.startswith(sys.prefix + os.sep)) and not holds_sandboxes:
                paths.add(entry)
    return sorted(path for path in paths if os.path.exists(path))


def _without_nested(paths: list[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(paths):
        if not any(path.startswith(parent.rstrip(os.sep) + os.sep) for parent in kept):
            kept.append(path)
    return kept


class Sandbox(WatchedFromOutside):
    """One submission's confinement. ``command(python)`` is what starts its first process.

    ``scratch`` is the one folder both sides see (the same path inside and out): the learner
    side may write there, and a check may hand it files (e.g. a folder for checkpoints).
    """

    def __init__(self, memory_bytes: int = MEMORY_LIMIT_BYTES, processes: int = PROCESS_LIMIT):
        problem = sandbox_problem_cached()
        if problem:
            raise SandboxUnavailable(problem)
        self.memory_bytes, self.processes = memory_bytes, processes
        self.folder = Path(tempfile.mkdtemp(prefix=_name_prefix()))
        self.scratch = self.folder / "scratch"
        self.errors = self.folder / "errors.log"  # outside only: what bwrap and the launch server print
        self.scratch.mkdir()
        self.private_folders = ("/tmp", "/dev/shm")  # tmpfs mounts inside: read from outside with view_of()
        self.tmpfs_bytes, self.tmpfs_files = TMPFS_LIMIT_BYTES, TMPFS_LIMIT_FILES
        self.socket_bytes = SOCKET_MEMORY_LIMIT_BYTES
        self.init_pid: int | None = None  # the sandbox's init (pid 1 inside), outside
        self.cgroups = None
        if os.geteuid() == 0:
            self.cgroups = Cgroups(cgroup_roots(), f"{_name_prefix()}{uuid.uuid4().hex[:12]}", memory_bytes, processes)
        self.pid: int | None = None  # bwrap's pid, outside
        self.server = None  # the launch server inside (a multiprocessing ForkServer), while it runs
        self._infrastructure: set[int] | None = None
        self.rank_pids: set[int] = set()  # every launch's ranks (pids outside): a rank is never a "helper"
        self._watchdog: threading.Thread | None = None
        self.watch = {"passes": 0, "most_files": 0, "most_socket_bytes": 0, "errors": 0,
                      "last_error": None}  # what the watchdog saw
        self._diag = None  # a netlink socket that answers for the sandbox's network namespace
        self._watch_diag = None  # the watchdog's own one (one netlink socket cannot serve two threads)
        self.ended_because: str | None = None
        self.closed = False
        atexit.register(self.close)

    def bwrap_arguments(self) -> list[str]:
        args = [_bwrap(), "--unshare-all", "--die-with-parent", "--new-session",
                "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "learner",
                "--cap-drop", "ALL", "--proc", "/proc", "--dev", "/dev"]
        for name in ("bin", "lib", "lib64", "sbin"):  # merged /usr: these are links into it
            path = Path("/") / name
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), str(path)]
            elif path.is_dir():
                args += ["--ro-bind", str(path), str(path)]
        # /tmp and /dev/shm first: a read-only path below /tmp (a course cloned there) goes on top.
        # A tmpfs of a given size needs bwrap 0.8 (--size); an older one makes it as large as the
        # kernel's default (half the memory) and the watchdog alone holds it to the limit.
        for inside in self.private_folders:
            args += (["--size", str(self.tmpfs_bytes)] if _bwrap_sizes_tmpfs() else []) + ["--tmpfs", inside]
        for path in _without_nested(_read_only_paths()):
            args += ["--ro-bind", path, path]
        for device in sorted(Path("/dev").glob("nvidia*")):  # a GPU grader: the ranks see the GPUs
            args += ["--dev-bind", str(device), str(device)]
        args += ["--bind", str(self.scratch), str(self.scratch)]  # the folder both sides see, at one path
        # Names resolve from files only, at once: no DNS can answer inside (gloo, torchrun and the
        # TCPStore look up the host's name and their peers' addresses).
        etc = self.folder / "etc"
        etc.mkdir(exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost learner\n::1 localhost\n")
        (etc / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
        (etc / "resolv.conf").write_text("")
        for name in ("hosts", "nsswitch.conf", "resolv.conf"):
            args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
        args += ["--chdir", str(self.scratch),
                 "--setenv", "HOME", str(self.scratch), "--setenv", "TMPDIR", "/tmp"]
        return args

    def executable(self, python: str = sys.executable) -> str:
        """A program that runs ``python ARGS...`` inside this sandbox (what the launch server starts with).

        Its errors (bwrap's own, the launch server's) go to a file of the sandbox's folder outside,
        which the judge quotes when the sandbox cannot start. It runs in a session of its own
        (``setsid``, which execs without forking: the pid stays bwrap's): jupyter_client interrupts a
        kernel whose cell ran out of time by signalling the kernel's whole process group (with
        ipykernel 6, whose kernels take interrupts as signals), and one learner's hanging cell must not
        end the sandbox, and the grades, of the batch-mates after it."""
        limits = [f"--nproc={self._process_rlimit()}", f"--fsize={FILE_SIZE_LIMIT_BYTES}", f"--cpu={CPU_SECONDS_LIMIT}",
                  "--core=0"]
        script = self.folder / "enter"
        script.write_text("#!/bin/sh\n" + (self.cgroups.join_command() if self.cgroups else "")
                          + f"exec {shlex.join([_setsid(), _prlimit(), *limits, '--', *self.bwrap_arguments(), python])} \"$@\""
                          + f" 2>>{shlex.quote(str(self.errors))}\n")
        script.chmod(0o700)
        return str(script)

    def _process_rlimit(self) -> int:
        """RLIMIT_NPROC for the sandbox (the limit on processes when there is no cgroup: an ordinary user).

        The kernel counts every task (thread) of the user against it, not only the sandbox's: an
        instructor whose browser and editor already run 1,500 threads could not start one rank under a
        plain 1,024. So: what the user runs now, plus the sandbox's own allowance (within the hard limit)."""
        if os.geteuid() == 0:
            return self.processes  # not enforced for root: the cgroup's pids.max limits the sandbox
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        wanted = _tasks_of_user(os.getuid()) + self.processes
        return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)

    def started(self, pid: int, server) -> None:
        """The sandbox's first process (bwrap) has started with this pid, running the launch server
        ``server`` (a multiprocessing ForkServer): watch its memory from now on."""
        self.pid, self.server = pid, server
        try:
            if self.cgroups is not None and self._joined_cgroups(pid) is False and not _has_exited(pid):
                # (exited: bwrap could not make the sandbox, and _wait_for_the_server quotes why)
                raise SandboxUnavailable(f"the sandbox's first process ({pid}) is not in its cgroups "
                                         f"{self.cgroups.dirs}: its limits on processes and memory would not hold; "
                                         "not grading without them" + self._errors_said())
            self._wait_for_the_server(pid)
        except SandboxUnavailable as exc:
            self.end(str(exc))  # a later launch in it says why, instead of talking to a server that is not there
            raise
        self._watchdog = threading.Thread(target=self._watch, name="sandbox-watchdog", daemon=True)
        self._watchdog.start()

    def _wait_for_the_server(self, pid: int, wait_s: float = 60.0) -> None:
        """Return once the launch server runs inside (pid 2 there); raise, quoting bwrap, if the sandbox
        could not be made (it is started without waiting)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            inside = self._inside_pids()
            if 2 in inside.values():
                self.init_pid = next(outside for outside, number in inside.items() if number == 1)
                return
            if _has_exited(pid):
                break  # bwrap exited: the sandbox could not be made
            time.sleep(0.01)
        else:
            raise SandboxUnavailable(f"the sandbox's launch server did not start within {wait_s:g} s"
                                     + self._errors_said())
        raise SandboxUnavailable("the sandbox could not be made" + (self._errors_said() or ": bwrap exited"))

    def _errors_said(self) -> str:
        with contextlib.suppress(OSError):
            text = self.errors.read_text(errors="replace").strip()
            if text:
                return f"; it said: {text[-2000:]}"
        return ""

    def _joined_cgroups(self, pid: int, wait_s: float = 30.0) -> bool | None:
        """Whether the sandbox's first process is in its cgroups, once its start script has run
        (the server is started without waiting: the script may still be joining them); None if
        it exited before it became bwrap (_wait_for_the_server says why)."""
        bwrap = os.path.realpath(_bwrap())
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _has_exited(pid):
                return None
            try:
                if os.path.realpath(f"/proc/{pid}/exe") == bwrap:
                    break
            except OSError:
                return False  # it is gone
            time.sleep(0.01)
        return self.cgroups.holds(pid)

    # ----- what is inside, seen from outside
    def processes_inside(self) -> list[int]:
        """Pids (outside) of every process in the sandbox, bwrap's own first.

        Walks the sandbox's own process tree (/proc/PID/task/TID/children): a daemon that left its
        parent is re-parented to the sandbox's init, so it is still found, and no other process
        of the machine is read."""
        if self.pid is None:
            return []
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError, ValueError):
                        todo += [int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        return found

    def _inside_pids(self) -> dict[int, int]:
        """pid outside -> pid inside, for every process in the sandbox but bwrap's own."""
        pids = {}
        for pid in self.processes_inside():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("NSpid:"):
                        numbers = line.split()[1:]
                        if len(numbers) > 1:
                            pids[pid] = int(numbers[-1])
        return pids

    def infrastructure_pids(self) -> set[int]:
        """bwrap, its init (pid 1 inside) and the launch server (pid 2 inside): not the learner's."""
        if self._infrastructure is None:
            self._infrastructure = {self.pid} | {outside for outside, inside in self._inside_pids().items()
                                                 if inside <= 2}
        return self._infrastructure

    def outside_pid(self, inside_pid: int) -> int:
        """The pid, outside, of the sandbox's process that has ``inside_pid`` inside."""
        if self.pid is not None and _has_exited(self.pid):
            raise LookupError(f"the sandbox has ended: its first process ({self.pid}) exited" + self._errors_said())
        for _ in range(20):  # a process that was just forked: give /proc a moment
            for outside, inside in self._inside_pids().items():
                if inside == inside_pid:
                    return outside
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            program = os.readlink(f"/proc/{self.pid}/exe")
            ancestry = Path(f"/proc/{inside_pid}/status").read_text().split("PPid:")[1].split()[0]
            raise LookupError(f"process {inside_pid} is not in the sandbox (its first process is {self.pid}, "
                              f"{program}; {inside_pid}'s parent is {ancestry}; inside: {self._inside_pids()})")
        raise LookupError(f"no process {inside_pid} in the sandbox")

    def view_of(self, inside: str) -> Path:
        """Where the judge, outside, reaches the sandbox's own folder ``inside`` (/tmp, /dev/shm: mounts
        that only the sandbox's mount namespace has). Read it without following links: a link's
        absolute target would resolve against the judge's root, not the sandbox's."""
        if self.init_pid is None:
            raise LookupError("the sandbox has not started")
        return Path(f"/proc/{self.init_pid}/root") / inside.lstrip("/")

    def _writable_folders(self) -> list[Path]:
        """Every folder the learner side can write to, as the judge reaches it."""
        return [self.scratch] + [self.view_of(inside) for inside in self.private_folders]

    def end(self, why: str | None = None) -> None:
        """Kill everything in the sandbox (killing bwrap ends its pid namespace with it)."""
        if why and not self.ended_because:
            self.ended_because = why
        server, self.server = self.server, None
        for diag in (self._diag, self._watch_diag):
            if diag is not None:
                diag.close()
        self._diag = self._watch_diag = None
        if server is not None:
            with contextlib.suppress(OSError, TypeError):
                os.close(server._forkserver_alive_fd)
            with contextlib.suppress(OSError, TypeError):
                os.unlink(server._forkserver_address)
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.pid, 0)

    def empty_for_the_next_submission(self) -> bool:
        """Make this sandbox as the next submission would find a new one, without starting a new launch
        server (which imports torch: most of what a sandbox costs a submission). Every process but bwrap,
        its init and the launch server is killed, and every writable folder emptied. Nothing else of a
        submission outlives it: its ranks were kept apart from the launch server (course_lib.confine.apart:
        no tracing, no signals, no Unix sockets, no System V or POSIX message queues), so the server is as
        it started. Only where Landlock keeps signals apart (ABI 6); False, and nothing done, where the
        sandbox cannot be reused (then close it and make another)."""
        from ..confine import apart

        if self.closed or self.ended_because or self.server is None or self.pid is None or _has_exited(self.pid):
            return False
        if apart.landlock_abi() < 6:  # a rank could signal the launch server, and so end the next submission's
            return False
        infrastructure = self.infrastructure_pids()
        if len(infrastructure) != 3 or not all(_alive(pid) for pid in infrastructure):
            return False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            learners = [pid for pid in self.processes_inside() if pid not in infrastructure]
            if not learners:
                break
            for pid in learners:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        else:
            return False  # processes that outlive every kill: end the sandbox instead
        for folder in self._writable_folders():
            empty_folder(folder)
            if self.left_in(folder):
                return False
        self.rank_pids.clear()
        return True

    def left_in(self, folder: Path) -> list[Path]:
        """What is in ``folder`` (one reached from outside) besides the mount points bwrap made below it
        (the scratch folder, a course cloned below /tmp) and the directories on the way to them."""
        device = os.lstat(folder).st_dev
        left = []
        for entry in folder.iterdir():
            stat = os.lstat(entry)
            if stat.st_dev != device:
                continue  # a mount point: not the learner's
            if entry.is_dir() and not entry.is_symlink():
                inner = self.left_in(entry)
                if inner or not holds_a_mount_point(entry, device):
                    left += inner or [entry]
            else:
                left.append(entry)
        return left

    def close(self) -> None:
        self.closed = True
        self.end()
        if self.cgroups is not None:
            self.cgroups.remove()
        shutil.rmtree(self.folder, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _bwrap_sizes_tmpfs() -> bool:
    """Whether this bwrap sets a tmpfs's size (--size, bubblewrap 0.8 and later)."""
    run = subprocess.run([_bwrap(), "--help"], capture_output=True, text=True, timeout=30)
    return "--size" in run.stdout + run.stderr


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@functools.lru_cache(maxsize=None)
def sandbox_problem_cached() -> str | None:
    """sandbox_problem(), tried once per process."""
    return sandbox_problem()
