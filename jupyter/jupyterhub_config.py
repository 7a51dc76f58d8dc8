# JupyterHub for a class on one server: `make hub` (see docs/instructors.md, "Hosting a class on one server").
#
# One JupyterLab per learner, started from the course's .venv (so its lab settings and its kernel
# set-up, installed there by `make`, apply), as a Unix user of the learner's own (HUB_USER_PREFIX+NAME),
# with a home of its own that gets a copy of notebooks/ and exercises/ on the first start, in
# network and mount namespaces of its own and under cgroup limits (jupyter/hub_spawner.py says
# what each gives). The hub runs as root; its state (database, cookie secret, the instructor's API
# token, the learners' password hashes, the logins to hand out) lives in HUB_STATE, a folder only
# root can enter.
#
# One door: learners reach the hub only through its public port, HTTPS (or, with HUB_IP=127.0.0.1,
# a reverse proxy on the same machine that speaks HTTPS to them); the hub's own API and the
# proxy's API listen on 127.0.0.1 alone, and every cookie the hub sets is Secure and HttpOnly.
#
# Set through the environment (the Makefile passes its HUB_* variables on):
#   HUB_ROSTER             a file with the learners' user names, one a line (required): only they
#                          may log in, each with the password the hub made for them (jupyter/hub_logins.py)
#   HUB_ADMIN              the instructor's user name (default "instructor"): the admin page, /hub/admin
#   HUB_DOMAIN             the hub's DNS name (required): the hub answers at https://HUB_DOMAIN, and
#                          each learner's server at https://NAME.HUB_DOMAIN, an origin of its own, so
#                          that no page of one learner's runs with another user's login (it needs a
#                          wildcard DNS record, *.HUB_DOMAIN, and a certificate for both names). On one
#                          machine alone: hub.localhost (browsers take every *.localhost to the machine)
#   HUB_PORT               the port learners open (default 8000), on HUB_IP (default: every interface)
#   HUB_SSL_CERT, HUB_SSL_KEY  a certificate for HUB_DOMAIN and *.HUB_DOMAIN and its key (required unless
#                          HUB_IP is 127.0.0.1, behind an HTTPS reverse proxy on port 443 that passes the
#                          Host header on): the public port speaks HTTPS only
#   HUB_USER_PREFIX        the learners' Unix users are this prefix and the roster name (default
#                          "jupyter-"; the hub's own tests use "hubtest.", which no class can reach:
#                          a roster name has no '.')
#   HUB_STATE              the hub's folder (default .hub in the repository)
#   HUB_HOMES              where the learners' homes are made (default /home)
#   HUB_API_TOKEN          the instructor's token for the REST API (default: made once, kept in
#                          HUB_STATE/api_token)
#   HUB_CPUS_PER_LEARNER   CPU time each learner's processes may use together, in cores (default 1)
#   HUB_MEMORY_PER_LEARNER memory each learner's processes may use together, no swap (default 4G: eight
#                          open notebooks, each launching four ranks, fit; scripts/bench_launch_servers.py)
#   HUB_PROCESSES_PER_LEARNER  processes and threads each learner may have at once (default 512)
#   HUB_IDLE_MINUTES       a server nobody has used for this long is stopped (default 20)
#   HUB_KERNEL_IDLE_SECONDS    a kernel idle for this long is shut down (default 600)
import os
import re
import secrets
import socket
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hub_logins import LOGINS, RosterAuthenticator, hand_out_logins  # noqa: E402
from hub_spawner import LearnerSpawner, cgroup_problem, claim_network, claim_users, firewall_problem  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent  # the hub runs from the course's .venv
STATE = Path(os.environ.get("HUB_STATE") or REPO / ".hub").resolve()
STATE.mkdir(parents=True, exist_ok=True, mode=0o700)
STATE.chmod(0o700)


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


# A roster name: never a '.', so no roster name, under the default prefix, is one of the users the
# hub's tests make (their prefix, "hubtest.", has one).
_USER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,19}")
_USER_PREFIX = re.compile(r"[a-z][a-z0-9_.-]{0,11}")  # with a 20-character name: Unix's 32 at most
_DOMAIN = re.compile(r"(?=.{1,200}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?")


def _user_prefix() -> str:
    prefix = os.environ.get("HUB_USER_PREFIX") or "jupyter-"
    if not _USER_PREFIX.fullmatch(prefix):
        raise SystemExit(f"HUB_USER_PREFIX={prefix!r} cannot start a Unix user name: use at most 12 lower-case "
                         "letters, digits, '-', '_' or '.', starting with a letter (e.g. jupyter-)")
    return prefix


def _listens_on_loopback_only(ip: str) -> bool:
    return ip in ("127.0.0.1", "localhost", "::1")


def _domain() -> str:
    domain = (os.environ.get("HUB_DOMAIN") or "").strip().lower().rstrip(".")
    if not domain:
        raise SystemExit("HUB_DOMAIN is not set: give the hub a DNS name of its own (e.g. HUB_DOMAIN=hub.example.org), "
                         "with a wildcard record *.hub.example.org to the same server: each learner's server gets "
                         "an origin of its own, NAME.hub.example.org. On this machine alone: HUB_DOMAIN=hub.localhost")
    if not _DOMAIN.fullmatch(domain):
        raise SystemExit(f"HUB_DOMAIN={domain!r} is not a DNS name with at least two labels (e.g. hub.example.org)")
    return domain


def _certificate_names(cert: str) -> list[str]:
    """The DNS names a certificate is for (its subjectAltName), read with openssl."""
    shown = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-ext", "subjectAltName"],
                           capture_output=True, text=True, timeout=30)
    if shown.returncode != 0:
        raise SystemExit(f"HUB_SSL_CERT={cert} is not a PEM certificate openssl can read: {shown.stderr.strip()}")
    return [name.strip()[4:].lower() for name in shown.stdout.replace("\n", ",").split(",")
            if name.strip().startswith("DNS:")]


def certificate_covers(names: list[str], host: str) -> bool:
    """Whether a certificate for ``names`` is valid for ``host`` (a wildcard covers one label)."""
    parent = host.split(".", 1)[1] if "." in host else ""
    return host in names or f"*.{parent}" in names


def _roster() -> set[str]:
    """HUB_ROSTER: the learners allowed to log in, one user name a line ('#' starts a comment)."""
    path = os.environ.get("HUB_ROSTER")
    if not path:
        raise SystemExit("HUB_ROSTER is not set: give the hub a file with your learners' user names, one a line "
                         "(e.g. HUB_ROSTER=roster.txt make hub)")
    if not Path(path).is_file():
        raise SystemExit(f"HUB_ROSTER={path}: no such file (a file with your learners' user names, one a line)")
    names = {line.split("#")[0].strip().lower() for line in Path(path).read_text().splitlines()}
    names.discard("")
    if not names:
        raise SystemExit(f"HUB_ROSTER={path} names no learner (one user name a line)")
    bad = sorted(name for name in names if not _USER_NAME.fullmatch(name))
    if bad:
        raise SystemExit(f"{path}: {bad} are not user names the hub can make (lower-case letters, digits, '-' "
                         f"and '_', starting with a letter, at most 20 characters)")
    return names


_problem = cgroup_problem() or firewall_problem()
if _problem:
    raise SystemExit(f"The class hub cannot keep learners apart here: {_problem}.")

# --------------------------------------------------------------------------
# The hub
# --------------------------------------------------------------------------
c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

c.JupyterHub.ip = os.environ.get("HUB_IP", "")
c.JupyterHub.port = int(os.environ.get("HUB_PORT") or 8000)
CERTIFICATE = [os.environ.get("HUB_SSL_CERT"), os.environ.get("HUB_SSL_KEY")]
if any(CERTIFICATE):
    missing = [name for name, path in zip(("HUB_SSL_CERT", "HUB_SSL_KEY"), CERTIFICATE) if not path or not Path(path).is_file()]
    if missing:
        raise SystemExit(f"HTTPS needs both a certificate and its key as files: {' and '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} missing or not a file")
    if Path(CERTIFICATE[1]).stat().st_mode & 0o077:  # learners see the machine's files: /etc/ssl/... included
        raise SystemExit(f"HUB_SSL_KEY={CERTIFICATE[1]} may be read by other users, learners included, who could then "
                         f"pose as the hub: make it the hub's alone (chmod 600 {CERTIFICATE[1]})")
    c.JupyterHub.ssl_cert, c.JupyterHub.ssl_key = CERTIFICATE
elif not _listens_on_loopback_only(c.JupyterHub.ip):
    # Passwords and login cookies must never cross a network in plain text.
    raise SystemExit("The hub would serve plain HTTP to the network: give it a certificate and its key "
                     "(HUB_SSL_CERT and HUB_SSL_KEY), or put an HTTPS reverse proxy in front and set HUB_IP=127.0.0.1")
# One origin per learner: the hub at https://DOMAIN, a learner's server at https://NAME.DOMAIN. A page of a
# learner's (a file their server serves from their ~/.jupyter, a notebook they marked trusted) then runs on
# the learner's own origin, where the browser gives it no other user's cookies and no other origin's replies.
# (On one origin, any page a learner's server serves could read and drive the server and the hub pages of
# whoever opens it.) Every cookie stays on the host that set it (JupyterHub's session id, which is no login,
# excepted).
DOMAIN = _domain()
if all(CERTIFICATE):
    NAMES = _certificate_names(CERTIFICATE[0])
    uncovered = [host for host in (DOMAIN, f"learner.{DOMAIN}") if not certificate_covers(NAMES, host)]
    if uncovered:
        raise SystemExit(f"HUB_SSL_CERT is for {NAMES or 'no DNS name'}, not for "
                         f"{' and '.join(h.replace('learner.', '*.', 1) for h in uncovered)}: the hub answers at "
                         f"{DOMAIN} and each learner at NAME.{DOMAIN}; get a certificate for both "
                         f"(e.g. certbot with a DNS challenge: -d {DOMAIN} -d '*.{DOMAIN}')")
PUBLIC_PORT = c.JupyterHub.port if all(CERTIFICATE) else 443  # (else an HTTPS reverse proxy's)
c.JupyterHub.subdomain_host = f"https://{DOMAIN}" + ("" if PUBLIC_PORT == 443 else f":{PUBLIC_PORT}")
# Every cookie the hub sets (login, session, _xsrf; and each learner's server's login cookie) is
# sent over HTTPS only and never shown to the page's scripts.
c.JupyterHub.tornado_settings = {"cookie_options": {"secure": True, "httponly": True}}
# The hub's own API and the proxy's API: on 127.0.0.1 alone, on free ports (two hubs, or a test
# beside a class, never collide). Each learner's server reaches the hub's API through a relay that
# the hub opens inside the learner's own network namespace (LearnerSpawner), not over the network.
HUB_PORT = _free_port()
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{HUB_PORT}"
c.JupyterHub.hub_connect_url = f"http://127.0.0.1:{HUB_PORT}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{_free_port()}"
c.ConfigurableHTTPProxy.command = [str(REPO / ".venv" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(STATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "cookie_secret")
c.JupyterHub.pid_file = str(STATE / "hub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every learner's server

# Logins: the roster's learners and the instructor (the admin), each with the password the hub made
# for them before it opened (jupyter/hub_logins.py), which the instructor hands out; nobody else.
ADMIN = os.environ.get("HUB_ADMIN") or "instructor"
if not _USER_NAME.fullmatch(ADMIN):
    raise SystemExit(f"HUB_ADMIN={ADMIN!r} is not a user name the hub can make (lower-case letters, digits, '-' and "
                     "'_', starting with a letter, at most 20 characters)")
USER_PREFIX = _user_prefix()
LEARNERS = _roster()
c.JupyterHub.authenticator_class = RosterAuthenticator
c.RosterAuthenticator.state = str(STATE)
# Behind an HTTPS reverse proxy (HUB_IP=127.0.0.1, no certificate here), a login's address is the one
# that proxy saw, which it appends to X-Forwarded-For (nginx: $proxy_add_x_forwarded_for; Caddy does).
c.RosterAuthenticator.proxies_in_front = 0 if all(CERTIFICATE) else 1
c.Authenticator.allowed_users = LEARNERS | {ADMIN}
c.Authenticator.allow_existing_users = False  # a name taken off the roster cannot log in any more
# The instructor's login is no JupyterHub admin: that role may open every learner's server
# (access:servers), and a learner's page opened there (a notebook the learner marked trusted, a file from
# their ~/.jupyter) would run the learner's JavaScript on the hub's own origin with the instructor's rights.
# The instructor's role below has the admin page and starts and stops servers, and opens none; the admin
# role is the API token's alone (a terminal's curl, never a browser).
c.Authenticator.admin_users = set()
c.JupyterHub.active_server_limit = len(LEARNERS) + 1
NEW_LOGINS = hand_out_logins(STATE, LEARNERS | {ADMIN})
print(f"{len(LEARNERS)} learners may log in (HUB_ROSTER), and {ADMIN} as the admin, each with the password in "
      f"{STATE / LOGINS} (root only; {len(NEW_LOGINS)} new): hand each learner their line")

# The instructor's REST API token (a service with the admin role), and the culler of idle servers.
c.JupyterHub.services = [
    {"name": "instructor", "api_token": _kept_secret("api_token", "HUB_API_TOKEN", lambda: secrets.token_hex(32))},
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                 f"--timeout={int(float(os.environ.get('HUB_IDLE_MINUTES') or 20) * 60)}"]},
]
INSTRUCTOR_SCOPES = ["admin-ui", "list:users", "read:users", "read:users:activity", "read:servers", "admin:servers",
                     "read:hub", "list:services", "read:services"]
c.JupyterHub.load_roles = [
    {"name": "admin", "services": ["instructor"]},
    {"name": "class-instructor", "description": "the admin page; learners' servers started and stopped, never opened",
     "users": [ADMIN], "scopes": INSTRUCTOR_SCOPES},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]

# Each learner's server (jupyter/hub_spawner.py).
c.JupyterHub.spawner_class = LearnerSpawner
c.LearnerSpawner.course = str(REPO)
c.LearnerSpawner.homes = os.environ.get("HUB_HOMES") or "/home"
c.LearnerSpawner.state = str(STATE)
c.LearnerSpawner.hub_port = HUB_PORT
try:  # a range of learner addresses of this hub's own (a second hub on the server takes the next)
    c.LearnerSpawner.network = claim_network()
    claim_users(USER_PREFIX)  # (and no other hub here makes the same users)
except RuntimeError as error:
    raise SystemExit(f"The class hub cannot start: {error}.") from None
c.LearnerSpawner.user_prefix = USER_PREFIX
# Out of the learners' sight: the hub's state, wherever it is kept. Of the course's folder a learner
# sees only hub_spawner.COURSE_FOR_LEARNERS (no answers, tests, history, submissions or grades).
c.LearnerSpawner.hidden = [str(STATE)]
c.LearnerSpawner.processes_limit = int(os.environ.get("HUB_PROCESSES_PER_LEARNER") or 512)
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
KERNEL_IDLE_S = int(os.environ.get("HUB_KERNEL_IDLE_SECONDS") or 600)
c.Spawner.args = [
    # Kernels talk to the learner's server over local (IPC) sockets, in the learner's private /tmp.
    "--KernelManager.transport=ipc",
    # A kernel nobody has used for KERNEL_IDLE_S is shut down (its ranks with it).
    f"--MappingKernelManager.cull_idle_timeout={KERNEL_IDLE_S}",
    f"--MappingKernelManager.cull_interval={max(5, min(60, KERNEL_IDLE_S // 3))}",
]
c.Spawner.default_url = "/lab/tree/notebooks"
c.Spawner.cpu_limit = float(os.environ.get("HUB_CPUS_PER_LEARNER") or 1)
c.Spawner.mem_limit = _bytes(os.environ.get("HUB_MEMORY_PER_LEARNER") or "4G")
# Many servers starting at once on a small machine take longer than JupyterHub's 30 s default.
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
# COURSE_CPUS: launch gives each rank its share of the learner's CPU time, not of the machine's cores.
# OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that spins while it waits for work burns the learner's
# CPU time (results do not change).
c.Spawner.environment = {"PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
                         "COURSE_CPUS": str(max(1, round(c.Spawner.cpu_limit))),
                         "OMP_WAIT_POLICY": "PASSIVE"}
