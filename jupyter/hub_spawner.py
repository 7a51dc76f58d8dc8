"""The class hub's spawner (jupyter/jupyterhub_config.py): each learner's JupyterLab runs

* as a Unix user of the learner's own, ``jupyter-NAME`` (``user_prefix`` + NAME), made by the hub,
  with a home of its own (mode 700) that gets a copy of notebooks/ and exercises/ on the first start;
* in a network namespace of its own, joined to the machine by one veth pair: the learner's ranks
  talk over a loopback no other learner reaches, and the namespace has no route to any other
  learner's (only the proxy, from the machine, reaches it). The hub's API listens on the machine's
  127.0.0.1 alone; the learner's server reaches it through a relay the hub opens on the
  namespace's own 127.0.0.1 (``HubRelay``), so nothing outside the machine can. The namespace's
  own firewall (``LEARNER_FIREWALL``) refuses every connection the learner opens through the veth
  (the machine's services, a Slurm controller among them, or anything beyond): deny by default.
  Each hub on the machine holds a range of addresses of its own (``claim_network``);
* in a mount namespace of its own, where the course's folder shows only what a learner needs
  (``COURSE_FOR_LEARNERS``: the lessons, the library, the Python environment), read-only, and
  nothing else (no solutions/, tests/, .git, hub state, submissions, roster, grades or keys, nor
  any file added later: deny by default); the hub's state folder and the machine's /tmp,
  /dev/shm, /var/tmp and /run/lock are replaced by empty folders (private ones, the learner's
  alone); its /proc shows the learner's own processes only (hidepid);
* in cgroups the learner cannot write: memory (no swap), processes and CPU time, so a memory hog,
  a fork bomb or a busy loop costs only its own learner.

The hub must run as root (it makes users, namespaces and cgroups). Made in the hub's process,
before the learner's server starts (``make_preexec_fn``): nothing of it can be undone by the
learner's code, which never runs with more than the learner's own user id.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import os
import pwd
import shutil
import stat
import socket
import subprocess
import sys
import threading
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Integer, List, Unicode

from course_lib.confine.cgroups import own_cgroup_v1  # the grading sandbox finds its cgroups the same way

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MS_RDONLY, MS_REMOUNT = 1, 32
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def _checked(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    _checked(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=60)


# --------------------------------------------------------------------------
# The learner's Unix user
# --------------------------------------------------------------------------
def system_user(learner: str, homes: Path, prefix: str = "jupyter-") -> pwd.struct_passwd:
    """``prefix`` + NAME (``jupyter-NAME``, TLJH's naming), made on the first start, its home
    private to it."""
    name = f"{prefix}{learner}"
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        homes.mkdir(parents=True, exist_ok=True)
        _run("useradd", "--home-dir", str(homes / name), "--create-home", "--shell", "/bin/bash",
             "--user-group", "--comment", f"course learner {learner}", name)
        user = pwd.getpwnam(name)
    os.chmod(user.pw_dir, 0o700)
    return user


def copy_course(course: Path, home: Path, folders, user: pwd.struct_passwd) -> None:
    """The learner's own copy of ``folders`` (owned by the learner), on the first start only."""
    for folder in folders:
        target = home / folder
        if target.exists():
            continue
        shutil.copytree(course / folder, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for path in [target, *target.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)


# --------------------------------------------------------------------------
# The learner's network: a namespace and one veth pair
# --------------------------------------------------------------------------
def addresses(index: int, network: str = "10.213") -> tuple[str, str]:
    """(the machine's end, the learner's end) of learner ``index``'s /30 link."""
    base = 4 * index
    prefix = f"{network}.{base // 256}."
    return prefix + str(base % 256 + 1), prefix + str(base % 256 + 2)


# The namespace's own firewall, set by root before the learner's server starts (the learner has no
# CAP_NET_ADMIN there, so cannot change it): the namespace answers connections made to it (the
# proxy's, from the machine) and talks freely on its own loopback (ranks, the relay to the hub);
# anything it would open through the veth is refused at once (a reset, not a wait).
LEARNER_FIREWALL = """
table inet learner {
  chain outgoing {
    type filter hook output priority 0; policy drop;
    oif "lo" accept
    ct state established,related accept
    meta l4proto tcp reject with tcp reset
    reject
  }
}
"""


def firewall_problem() -> str | None:
    """Why the hub cannot keep learners off the machine's services here, or None."""
    if shutil.which("nft") is None:
        return ("`nft` is missing, which fences each learner's network off the machine's services: install "
                "nftables (Debian and Ubuntu: apt-get install nftables)")
    return None


# Each hub on the machine holds one range (10.X.*.*) of learner addresses, so two hubs never hand out
# the same one: an abstract Unix socket named after the range, which the kernel lets go of when the
# hub ends, however it ends (no file to leave behind).
LEARNER_RANGES = [f"10.{second}" for second in range(213, 245)]
_held: list[socket.socket] = []  # the abstract sockets this hub holds (its address range, its user prefix)


def _hold(name: str) -> bool:
    """Hold the abstract Unix socket ``name`` until the hub ends; False if another process holds it."""
    holder = socket.socket(socket.AF_UNIX)
    try:
        holder.bind(f"\0{name}")
    except OSError:
        holder.close()
        return False
    _held.append(holder)
    return True


def claim_network(ranges=LEARNER_RANGES) -> str:
    """The first range of learner addresses no other hub on this machine holds, held from now on."""
    for network in ranges:
        if _hold(f"course-hub-learners-{network}"):
            return network
    raise RuntimeError(f"every range of learner addresses ({ranges[0]}.*.* to {ranges[-1]}.*.*) is held by another "
                       "hub on this server: stop one of them first")


def claim_users(prefix: str) -> None:
    """Hold this hub's user prefix while it runs. A second hub with the same prefix would make the
    same Unix users, and its learners would log in to the first class's homes and servers."""
    if not _hold(f"course-hub-users-{prefix}"):
        raise RuntimeError(f"another hub on this server makes its learners' users as {prefix}NAME: a second class "
                           f"on the same server needs a prefix of its own (e.g. HUB_USER_PREFIX=class2-), or "
                           f"its learners would be the first class's")


def release_networks() -> None:
    """Let go of everything this hub holds (its address range and its user prefix)."""
    while _held:
        _held.pop().close()


def make_network(namespace: str, host_link: str, host_ip: str, learner_ip: str) -> None:
    remove_network(namespace, host_link)
    _run("ip", "netns", "add", namespace)
    _run("ip", "link", "add", host_link, "type", "veth", "peer", "name", "eth0", "netns", namespace)
    _run("ip", "addr", "add", f"{host_ip}/30", "dev", host_link)
    _run("ip", "link", "set", host_link, "up")
    inside = ("ip", "netns", "exec", namespace, "ip")
    _run(*inside, "addr", "add", f"{learner_ip}/30", "dev", "eth0")
    _run(*inside, "link", "set", "eth0", "up")
    _run(*inside, "link", "set", "lo", "up")
    try:
        set_firewall(namespace)
    except RuntimeError:
        remove_network(namespace, host_link)  # (no namespace without its firewall)
        raise


def set_firewall(namespace: str) -> None:
    loaded = subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=LEARNER_FIREWALL,
                            capture_output=True, text=True, timeout=60)
    if loaded.returncode != 0:
        raise RuntimeError(f"the firewall of network namespace {namespace} could not be set: {loaded.stderr.strip()} "
                           "(where the kernel lacks nf_tables or nf_conntrack: `modprobe nf_tables nf_conntrack`)")


def remove_network(namespace: str, host_link: str) -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _run("ip", "link", "del", host_link)
    with contextlib.suppress(subprocess.CalledProcessError):
        _run("ip", "netns", "del", namespace)


def listen_in_namespace(namespace_file: str, address: str) -> socket.socket:
    """A listening TCP socket (a free port) inside a learner's network namespace, made by this
    (root) process: a thread of its own enters the namespace, makes the socket and ends, so the
    hub's other threads never leave the machine's namespace."""
    made: dict = {}

    def make():
        try:
            with open(namespace_file) as namespace:
                _checked(_libc.setns(namespace.fileno(), CLONE_NEWNET), "setns(network)")
            listener = socket.socket()
            listener.bind((address, 0))
            listener.listen(64)
            listener.setblocking(False)
            made["socket"] = listener
        except OSError as error:
            made["error"] = error

    thread = threading.Thread(target=make, name="listen-in-namespace")
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


class HubRelay:
    """Connections to ``listener`` (in a learner's namespace) carried to the hub's API on the
    machine's 127.0.0.1: the learner's server reaches the hub, nobody off the machine does."""

    def __init__(self, listener: socket.socket, hub_port: int):
        self.listener, self.hub_port, self.server = listener, hub_port, None
        self.port = listener.getsockname()[1]

    async def start(self) -> "HubRelay":
        self.server = await asyncio.start_server(self._carry, sock=self.listener)
        return self

    async def _carry(self, client_reader, client_writer) -> None:
        try:
            hub_reader, hub_writer = await asyncio.open_connection("127.0.0.1", self.hub_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(_pipe(client_reader, hub_writer), _pipe(hub_reader, client_writer))

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.listener.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


# --------------------------------------------------------------------------
# The learner's limits: cgroups (v1 or v2) the learner cannot write
# --------------------------------------------------------------------------
def cgroup_problem() -> str | None:
    """Why the hub cannot limit learners here, or None."""
    if os.geteuid() != 0:
        return "the hub must run as root (it makes a user, namespaces and cgroups for each learner)"
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        missing = {"memory", "pids", "cpu"} - set((base / "cgroup.subtree_control").read_text().split())
        return f"cgroup v2 controllers {sorted(missing)} are not enabled in {base}/cgroup.subtree_control" \
            if missing else None
    missing = [name for name in ("memory", "pids", "cpu") if own_cgroup_v1(name) is None]
    return f"no cgroup v1 hierarchy for {missing} under /sys/fs/cgroup" if missing else None


class LearnerCgroups:
    """One learner's cgroups: memory without swap, a number of processes, a share of CPU time."""

    def __init__(self, name: str):
        base = Path("/sys/fs/cgroup")
        self.v2 = (base / "cgroup.controllers").exists()
        if self.v2:
            self.dirs = {"all": base / name}
        else:
            self.dirs = {controller: own_cgroup_v1(controller) / name for controller in ("memory", "pids", "cpu")}

    def make(self, memory_bytes: int, processes: int, cpus: float) -> "LearnerCgroups":
        for folder in self.dirs.values():
            folder.mkdir(exist_ok=True)
        period = 100_000
        quota = max(1000, int(cpus * period))
        if self.v2:
            folder = self.dirs["all"]
            (folder / "memory.max").write_text(str(memory_bytes))
            (folder / "memory.swap.max").write_text("0")
            (folder / "pids.max").write_text(str(processes))
            (folder / "cpu.max").write_text(f"{quota} {period}")
        else:
            memory = self.dirs["memory"]
            (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):  # only where the kernel accounts swap
                (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (self.dirs["pids"] / "pids.max").write_text(str(processes))
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(period))
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))
        return self

    def join(self) -> None:
        """Move this process (the learner's server, before it starts) into the cgroups."""
        for folder in self.dirs.values():
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def processes(self) -> set[int]:
        found = set()
        for folder in self.dirs.values():
            with contextlib.suppress(OSError):
                found |= {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
        return found

    def remove(self) -> None:
        for folder in self.dirs.values():
            with contextlib.suppress(OSError):
                folder.rmdir()


# --------------------------------------------------------------------------
# The learner's view of the files
# --------------------------------------------------------------------------
def blocked_directories(paths) -> list[Path]:
    """Directories on the way to ``paths`` (not the paths themselves: a home is its owner's) that
    others cannot enter (a course under /root), shallowest first."""
    blocked = set()
    for path in paths:
        for directory in reversed(path.parents):
            if directory != Path("/") and not directory.stat().st_mode & stat.S_IXOTH:
                blocked.add(directory)
    return sorted(blocked, key=lambda d: len(d.parts))


# Of the course's folder, all a learner sees (read-only); anything else there is absent.
COURSE_FOR_LEARNERS = {
    "notebooks": "the lessons (each learner works on a copy in their home)",
    "exercises": "the exercises (likewise copied)",
    "course_lib": "the library the lessons import (.venv's editable install of it points here)",
    ".venv": "the Python environment the learner's server and kernels run from, with its Jupyter settings",
    "README.md": "what the course is",
    "LICENSE": "the terms the course is shared under",
}  # (no data/: the lessons read ../data next to the learner's own notebooks, in their home)


# Replaced by a private, empty one for each learner (where one is a link, as /var/lock is, what it
# points to).
SHARED_SCRATCH = (Path("/tmp"), Path("/dev/shm"), Path("/var/tmp"), Path("/run/lock"))


def own_processes_only() -> None:
    """A /proc of this mount namespace's own that shows a user their own processes alone
    (hidepid=invisible: another learner's, or the hub's, are not even listed). Linux 5.8 and newer
    give each such mount its own options; an older kernel refuses "invisible" (it would have
    changed the machine's /proc), and the learner's server does not start."""
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError as error:
        raise OSError(error.errno, f"{error.strerror}: a /proc of the learner's own (hidepid=invisible) needs "
                                   "Linux 5.8 or newer: upgrade the server's kernel") from None


def _bind_read_only(source: Path, target: Path) -> None:
    target.mkdir() if source.is_dir() else target.touch()
    _mount(str(source), str(target), None, MS_BIND | MS_REC)
    _mount(None, str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def only_what_learners_need(course: Path, original: Path, visible) -> None:
    """Cover the course's folder with an empty tmpfs (root's, read-only) and bind back, read-only,
    only the ``visible`` entries of its ``original`` (a bind of it made before anything was covered)."""
    _mount("tmpfs", str(course), "tmpfs", 0, "mode=755")
    for name in visible:
        if (original / name).exists():
            _bind_read_only(original / name, course / name)
    _mount("tmpfs", str(course), "tmpfs", MS_REMOUNT | MS_RDONLY, "mode=755")


def private_view(needed, course: Path, visible, hidden, stash: Path, replaced: dict) -> None:
    """In a new mount namespace (this process, as root): cover the SHARED_SCRATCH folders and
    each directory on the way to ``needed`` that learners cannot enter (a course under /root) with
    a tmpfs that holds only the way through to ``needed``, then show of ``course`` only its
    ``visible`` entries, read-only, cover each of ``hidden`` with an empty tmpfs and each file in
    ``replaced`` with its replacement, and mount a /proc that shows the learner's own processes
    only. ``stash``: a root-only folder outside everything covered, for the bind mounts."""
    _checked(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    original_course = stash / "course"  # (bound before anything is covered: the whole course)
    original_course.mkdir(parents=True, exist_ok=True)
    _mount(str(course), str(original_course), None, MS_BIND | MS_REC)
    scratch = {folder.resolve() for folder in SHARED_SCRATCH if folder.is_dir()}
    covered = sorted(set(blocked_directories(needed)) | scratch, key=lambda d: len(d.parts))
    for number, directory in enumerate(covered):
        kept = stash / str(number)
        kept.mkdir(parents=True, exist_ok=True)
        _mount(str(directory), str(kept), None, MS_BIND | MS_REC)
        _mount("tmpfs", str(directory), "tmpfs", 0, "mode=1777" if directory in scratch else "mode=755")
        for child in sorted({p.relative_to(directory).parts[0] for p in needed if directory in p.parents}):
            (directory / child).mkdir() if (kept / child).is_dir() else (directory / child).touch()
            _mount(str(kept / child), str(directory / child), None, MS_BIND | MS_REC)
    only_what_learners_need(course, original_course, visible)
    for path in hidden:
        if Path(path).is_dir():  # (one under a covered directory is already out of sight)
            _mount("tmpfs", str(path), "tmpfs", 0, "mode=755")
    for target, replacement in replaced.items():
        _mount(str(replacement), str(target), None, MS_BIND)
    own_processes_only()


def names_without_dns(folder: Path) -> dict:
    """A learner's namespace reaches no name server: host names come from /etc/hosts alone. (Else
    every lookup waits for one, and fails: torch's c10d then warns "The hostname of the client
    socket cannot be retrieved" at each connection.)"""
    nsswitch = Path("/etc/nsswitch.conf")
    if not nsswitch.exists():
        return {}
    lines = ["hosts: files" if line.split(":")[0].strip() == "hosts" else line
             for line in nsswitch.read_text().splitlines()]
    replacement = folder / "nsswitch.conf"
    replacement.write_text("\n".join(lines) + "\n")
    replacement.chmod(0o644)
    return {nsswitch: replacement}


# --------------------------------------------------------------------------
# The spawner
# --------------------------------------------------------------------------
class LearnerSpawner(LocalProcessSpawner):
    """One JupyterLab per learner: own user, own network and mount namespaces, limits in cgroups."""

    homes = Unicode("/home", config=True, help="Where the learners' homes are made")
    user_prefix = Unicode("jupyter-", config=True, help="A learner's Unix user is this prefix and their name")
    course = Unicode(config=True, help="The course's folder (the repository)")
    copied_folders = List(["notebooks", "exercises"], config=True, help="Copied into each home at the first start")
    course_visible = List(list(COURSE_FOR_LEARNERS), config=True,
                          help="All a learner sees of the course's folder (read-only); the rest is absent")
    hidden = List(config=True, help="Folders outside the course learners must not see (covered by an empty tmpfs)")
    state = Unicode(config=True, help="The hub's state folder (root only)")
    hub_port = Integer(config=True, help="The hub's API port on 127.0.0.1 (reached from a learner's namespace "
                                         "through a relay)")
    processes_limit = Integer(512, config=True, help="Processes (and threads) a learner may have at once")
    network = Unicode("10.213", config=True, help="The first two octets of the learners' /30 links (claim_network: "
                                                  "no other hub's)")

    _indexes: dict = {}  # learner -> index of their link
    _relays: dict = {}  # learner -> their HubRelay

    @property
    def _tag(self) -> str:
        return hashlib.sha256(f"{self.state}{self.user.name}".encode()).hexdigest()[:8]

    @property
    def cgroup_name(self) -> str:
        return f"course-hub-{self._tag}"

    @property
    def namespace(self) -> str:
        return f"course-{self._tag}"

    @property
    def host_link(self) -> str:
        return f"crs{self._tag}"  # at most 15 characters

    @property
    def _index(self) -> int:
        if self.user.name not in self._indexes:
            taken = set(self._indexes.values())
            self._indexes[self.user.name] = next(i for i in range(1, 16384) if i not in taken)
        return self._indexes[self.user.name]

    def user_env(self, env):  # (called by start, after self.unix_user is set)
        user = self.unix_user
        env.update(USER=user.pw_name, LOGNAME=user.pw_name, HOME=user.pw_dir, SHELL=user.pw_shell,
                   JUPYTER_RUNTIME_DIR="/tmp/jupyter-runtime")
        return env

    async def start(self):
        problem = cgroup_problem()
        if problem:
            raise RuntimeError(f"Cannot start {self.user.name}'s server with limits: {problem}")
        self.unix_user = user = system_user(self.user.name, Path(self.homes), self.user_prefix)
        copy_course(Path(self.course), Path(user.pw_dir), self.copied_folders, user)
        host_ip, learner_ip = addresses(self._index, self.network)
        await asyncio.to_thread(make_network, self.namespace, self.host_link, host_ip, learner_ip)
        relay = await HubRelay(listen_in_namespace(f"/run/netns/{self.namespace}", "127.0.0.1"), self.hub_port).start()
        self._relays[self.user.name] = relay
        self.cgroups = LearnerCgroups(self.cgroup_name).make(int(self.mem_limit or 4 * 2**30), self.processes_limit,
                                                             float(self.cpu_limit or 1))
        self.ip = learner_ip
        self.hub_connect_url = f"http://127.0.0.1:{relay.port}"  # the learner's own loopback: the relay
        self.log.info("%s: user %s, network %s (%s), limits %.1f GiB, %d processes, %.1f CPUs", self.user.name,
                      user.pw_name, self.namespace, learner_ip, int(self.mem_limit or 0) / 2**30,
                      self.processes_limit, float(self.cpu_limit or 1))
        return await super().start()

    def make_preexec_fn(self, name):  # (called by start, after self.unix_user is set)
        user = self.unix_user
        become_learner = set_user_setuid(user.pw_name)
        namespace_file = f"/run/netns/{self.namespace}"
        cgroups = self.cgroups
        python = Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()
        course = Path(self.course).resolve()
        needed = [course, *python, Path(user.pw_dir)]
        visible = list(self.course_visible)
        hidden_folders = list(self.hidden)
        stash = Path("/run/course-hub") / self._tag  # not under anything covered
        stash.mkdir(parents=True, exist_ok=True, mode=0o700)
        replaced = names_without_dns(stash)  # (in the learner's stash: removed with it)

        def preexec():  # in the server's process, as root, before it starts: inherited by all it starts
            cgroups.join()
            with open(namespace_file) as namespace:
                _checked(_libc.setns(namespace.fileno(), CLONE_NEWNET), "setns(network)")
            private_view(needed, course, visible, hidden_folders, stash, replaced)
            become_learner()

        return preexec

    async def stop(self, now=False):
        await super().stop(now=now)
        await self._clean_up()

    async def poll(self):
        status = await super().poll()
        if status is not None and self.user.name in self._indexes:
            await self._clean_up()  # the server ended by itself (its learner's kill -9 -1): nothing of it stays
        return status

    async def _clean_up(self) -> None:
        """Stop whatever of the learner's still runs (a rank whose kernel was killed), then remove the
        learner's cgroups and network namespace (also after a hub restart, which forgets self.cgroups)."""
        cgroups = LearnerCgroups(self.cgroup_name)
        if any(folder.exists() for folder in cgroups.dirs.values()):
            for _ in range(50):
                left = cgroups.processes()
                if not left:
                    break
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                await asyncio.sleep(0.1)
            cgroups.remove()
        relay = self._relays.pop(self.user.name, None)
        if relay is not None:
            relay.close()
        await asyncio.to_thread(remove_network, self.namespace, self.host_link)
        shutil.rmtree(Path("/run/course-hub") / self._tag, ignore_errors=True)
        with contextlib.suppress(OSError):  # the last learner of every hub on the machine: nothing left
            Path("/run/course-hub").rmdir()
        self._indexes.pop(self.user.name, None)
