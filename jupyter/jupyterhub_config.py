# JupyterHub for a class on one server: `make hub` (see docs/instructors.md, "Hosting a class on one server").
#
# One JupyterLab per learner, started from the course's .venv (so its lab settings and its kernel
# set-up, installed there by `make`, apply), in a folder of the learner's own that gets a copy of
# notebooks/ and exercises/ on the learner's first start. Everything the hub keeps (its database,
# cookie secret, the instructor's API token, the learners' folders) lives in HUB_STATE.
#
# Set through the environment (the Makefile passes its HUB_* variables on):
#   HUB_PORT               the port learners open (default 8000), on HUB_IP (default: every interface)
#   HUB_STATE              the hub's folder (default .hub in the repository)
#   HUB_PASSWORD           the password every learner logs in with, any user name (8+ characters;
#                          without it the hub makes one and prints it)
#   HUB_API_TOKEN          the instructor's token for the REST API (default: made once, kept in
#                          HUB_STATE/api_token)
#   HUB_CPUS_PER_LEARNER   cores each learner's processes may run on (default 1)
#   HUB_MEMORY_PER_LEARNER memory each learner's processes may use together (default 2G)
#   HUB_IDLE_MINUTES       a server nobody has used for this long is stopped (default 60)
#
# Limits (CourseSpawner below). CPU: enforced by CPU affinity: a learner's server, kernels and
# launched ranks may run only on the learner's cores (launch counts them when it gives each rank
# its threads); learners share cores when there are more learners than cores. Memory: enforced
# by a memory cgroup per learner, made under the hub's own cgroup where the hub may write it
# (cgroup v1, or v2 with the memory controller delegated to the hub's cgroup): past the limit the
# kernel's OOM killer stops a process of that learner only. Where the hub cannot make cgroups,
# the memory limit is advisory only (the MEM_LIMIT variable the learner's server sees) and the hub
# log says so at each start.
import hashlib
import os
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner
from jupyterhub.utils import url_path_join  # noqa: F401 - handy when extending this file

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent  # the hub runs from the course's .venv
STATE = Path(os.environ.get("HUB_STATE") or REPO / ".hub").resolve()
LEARNERS = STATE / "learners"
COPIED_FOLDERS = ("notebooks", "exercises")
STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
# Names this hub's cgroups apart from another hub's on the same machine (a test beside a class).
HUB_ID = hashlib.sha256(str(STATE).encode()).hexdigest()[:8]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kept_secret(name: str, variable: str, make) -> str:
    """The value of `variable`, or one made once and kept in HUB_STATE/name."""
    if os.environ.get(variable):
        return os.environ[variable]
    path = STATE / name
    if not path.exists():
        path.write_text(make())
        path.chmod(0o600)
    return path.read_text().strip()


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


# --------------------------------------------------------------------------
# Per-learner limits
# --------------------------------------------------------------------------
def _own_memory_cgroup():
    """(folder of the hub's own memory cgroup, name of its limit file), or (None, why not)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines() if Path("/proc/self/cgroup").exists() else []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return (folder, "memory.limit_in_bytes") if os.access(folder, os.W_OK) else (None, f"{folder} is not writable")
    for line in lines:
        if line.startswith("0::"):  # cgroup v2: needs the memory controller delegated to our cgroup
            folder = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            control = folder / "cgroup.subtree_control"
            if control.exists() and "memory" in control.read_text().split() and os.access(folder, os.W_OK):
                return folder, "memory.max"
            return None, f"the memory controller is not delegated to {folder}"
    return None, "no memory cgroup"


class CourseSpawner(SimpleLocalProcessSpawner):
    """One JupyterLab per learner from .venv, on the learner's cores, in the learner's memory cgroup."""

    _cores_in_use: dict = {}  # user name -> the cores given to that learner's server

    @property
    def cgroup_name(self) -> str:
        return f"jupyterhub-{HUB_ID}-{self.user.name}"

    @property
    def runtime_dir(self) -> str:
        """Where the learner's kernels' sockets live: a short path (a socket's path has at most 107 bytes)."""
        return os.path.join(tempfile.gettempdir(), f"jupyterhub-{HUB_ID}-{self.user.name}")

    def get_env(self):
        env = super().get_env()
        env["JUPYTER_RUNTIME_DIR"] = self.runtime_dir
        return env

    def _choose_cores(self) -> set[int]:
        """The learner's share: whole cores, the least used first."""
        cores = sorted(os.sched_getaffinity(0))
        wanted = max(1, int(-(-(self.cpu_limit or len(cores)) // 1)))
        if wanted >= len(cores):
            return set(cores)
        load = {core: 0 for core in cores}
        for taken in self._cores_in_use.values():
            for core in taken:
                load[core] += 1
        chosen = set(sorted(cores, key=lambda core: (load[core], core))[:wanted])
        self._cores_in_use[self.user.name] = chosen
        return chosen

    def _make_cgroup(self):
        base, limit_file = _own_memory_cgroup()
        if base is None or not self.mem_limit:
            reason = "no limit set" if not self.mem_limit else limit_file
            self.log.warning("Memory limit of %s is advisory only (MEM_LIMIT): %s", self.user.name, reason)
            return None
        folder = base / self.cgroup_name
        try:
            folder.mkdir(exist_ok=True)
            (folder / limit_file).write_text(str(int(self.mem_limit)))
        except OSError as exc:
            self.log.warning("Memory limit of %s is advisory only (MEM_LIMIT): %s", self.user.name, exc)
            return None
        self.log.info("Memory of %s limited to %.1f GiB by cgroup %s", self.user.name, self.mem_limit / 2**30, folder)
        return folder

    def make_preexec_fn(self, name):
        make_home = super().make_preexec_fn(name)
        cores, cgroup = self._choose_cores(), self._make_cgroup()
        self.log.info("%s's server may run on cores %s", name, sorted(cores))

        def preexec():  # in the server's process, before it starts: inherited by all it starts
            make_home()
            os.sched_setaffinity(0, cores)
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        return preexec

    async def stop(self, now=False):
        await super().stop(now=now)
        self._cores_in_use.pop(self.user.name, None)
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        base, _ = _own_memory_cgroup()
        folder = base / self.cgroup_name if base else None
        if folder is not None and folder.exists():
            # Anything of the learner's still running (a worker whose kernel was killed): stop it.
            for pid in (folder / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
            try:
                folder.rmdir()
            except OSError as exc:
                self.log.warning("Could not remove %s: %s", folder, exc)


def copy_course(spawner):
    """On a learner's first start: their own copy of the lessons and exercises."""
    home = Path(spawner.home_dir)
    home.mkdir(parents=True, exist_ok=True)
    os.makedirs(spawner.runtime_dir, mode=0o700, exist_ok=True)
    for folder in COPIED_FOLDERS:
        if not (home / folder).exists():
            shutil.copytree(REPO / folder, home / folder, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))


# --------------------------------------------------------------------------
# The hub
# --------------------------------------------------------------------------
c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

c.JupyterHub.ip = os.environ.get("HUB_IP", "")
c.JupyterHub.port = int(os.environ.get("HUB_PORT") or 8000)
# The hub's own port and the proxy's API port are internal: free ones, so two hubs (or a test
# beside a class) never collide.
c.JupyterHub.hub_port = _free_port()
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{_free_port()}"
c.ConfigurableHTTPProxy.command = [str(REPO / ".venv" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "cookie_secret")
c.JupyterHub.pid_file = str(STATE / "hub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# Learners: any user name with the room's shared password.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = _kept_secret(
    "password", "HUB_PASSWORD", lambda: secrets.token_urlsafe(9))
c.Authenticator.allow_all = True
print(f"Learners log in with any user name and the password in {STATE / 'password'}"
      if not os.environ.get("HUB_PASSWORD") else "Learners log in with any user name and HUB_PASSWORD")

# The instructor: a service with the admin role, used through the REST API with its token.
c.JupyterHub.services = [
    {"name": "instructor", "api_token": _kept_secret("api_token", "HUB_API_TOKEN", lambda: secrets.token_hex(32))},
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                 f"--timeout={int(float(os.environ.get('HUB_IDLE_MINUTES') or 60) * 60)}"]},
]
c.JupyterHub.load_roles = [
    {"name": "admin", "services": ["instructor"]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]

# Each learner's server.
c.JupyterHub.spawner_class = CourseSpawner
c.CourseSpawner.home_dir_template = str(LEARNERS / "{username}")
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
# Kernels talk to the learner's server over local (IPC) sockets, not TCP ports: a TCP port chosen
# for a kernel can be taken by another learner's ranks before the kernel binds it, and then that
# kernel never starts.
c.Spawner.args = ["--KernelManager.transport=ipc"]
if os.geteuid() == 0:
    c.Spawner.args.append("--allow-root")  # JupyterLab refuses to run as root otherwise
c.Spawner.default_url = "/lab/tree/notebooks"
c.Spawner.pre_spawn_hook = copy_course
c.Spawner.cpu_limit = float(os.environ.get("HUB_CPUS_PER_LEARNER") or 1)
c.Spawner.mem_limit = _bytes(os.environ.get("HUB_MEMORY_PER_LEARNER") or "2G")
# Many servers starting at once on a small machine take longer than JupyterHub's 30 s default.
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
# OMP_WAIT_POLICY=PASSIVE: the learners' ranks share the server's cores, and an OpenMP thread that
# spins while it waits for work takes a core another learner's rank needs (results do not change).
c.Spawner.environment = {"PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                         "OMP_WAIT_POLICY": "PASSIVE"}
