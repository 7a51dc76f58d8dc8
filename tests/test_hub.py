"""A class on one server: the course's JupyterHub (`make hub`), as an instructor runs it, and as
learners (and one hostile learner) use it.

Starts the hub from jupyter/jupyterhub_config.py, as root, on a free port with HTTPS (a
certificate made for the test), a roster of three learners and an admin, its own state folder
and its own folder of homes, and Unix users of its own: their prefix, ``hubtest.``, has a '.',
which no roster name has, so the test never touches a real class's ``jupyter-NAME`` users. Every
learner logs in through the login form with the password the hub handed out (HUB_STATE/logins.txt)
and works with a token made from that login, never the instructor's. Then:

* every learner runs chapter 01's lesson at the same moment, cell by cell, through the hub's URL
  (the Jupyter server's REST API and the kernel's websocket, behind the proxy), with no error and
  no failed check; the exercise notebooks are collected from the homes as docs/instructors.md says
  and graded by scripts/grade.py;
* ada, as an attacker: her token gets 403 on grace's server and is refused grace's user record;
  from her kernel she cannot read grace's files, the hub's state, solutions/, tests/ or .git, nor
  write the course's library; of the course's folder she sees only what a learner needs (files
  planted there for the test, submissions, a roster, grades, an unknown file, are absent); she cannot connect to a port grace listens on (grace can); a memory
  hog of hers is killed by her own limit, a fork bomb stops at her process limit, and her
  `kill -9 -1` ends only her own processes; she cannot connect to a port the machine listens on
  (on 0.0.0.0, or on the machine's end of her link), nor change her namespace's firewall, while grace trains on 4 ranks and the hub keeps
  answering;
* ada lures grace: a page served by ada's own server (a static file her ~/.jupyter adds, which her
  server serves to anyone) is opened in grace's browser, in Chromium, while grace is logged in. It
  runs on ada's origin (each server has its own, NAME.hub.localhost), so it can read neither grace's
  files nor the hub's API as grace; the same attempts, run on grace's own origin, do read her files,
  so the refusal is the origin's; no page of the hub or of a server may be framed;
* linus's idle kernel is shut down by the culler.

At the end the servers and the hub are stopped, no process of theirs (or of the learners' users)
may be left, and the test removes the users (and their groups) it made, and only those.

Needs root, the `hub` extra and the proxy (`make hub-deps`), and the browser (`make browser-deps`);
without them the test is skipped with the reason, unless COURSE_REQUIRE_HUB=1 (CI), where it fails
instead.
"""

from __future__ import annotations

import csv
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from browser import chromium_path
from browser import missing_requirements as missing_browser
from optional import skip_or_fail

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jupyter"))
from hub_client import (Hub, Kernel, learner_hub, log_in, names_on_this_machine, remove_users,  # noqa: E402
                        run_notebook, start_hub, stop_hub, user_url)
from hub_spawner import COURSE_FOR_LEARNERS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PROXY = REPO / ".venv" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
HUB = Path(sys.executable).parent / "jupyterhub"
LEARNERS = ["ada", "grace", "linus"]
ADMIN = "teacher"
# The hub's name (HUB_DOMAIN): every *.localhost is this machine, to a browser and (names_on_this_machine)
# to the test's own requests, so each learner's server has an origin of its own, NAME.hub.localhost.
DOMAIN = "hub.localhost"
# The test's Unix users: "hubtest." and a roster name. A roster name never has a '.', so under the
# default prefix ("jupyter-") no name of a real class is one of these.
TEST_PREFIX = "hubtest."
LESSON = "01_collectives.ipynb"
KERNEL_IDLE_S = 20
SCRATCH = ("/var/tmp", "/run/lock", "/dev/shm")  # the machine's shared scratch folders: each learner gets her own


def _missing_requirements() -> str | None:
    if os.geteuid() != 0:
        return "the class hub runs as root (it makes a user, namespaces and cgroups per learner)"
    try:
        import jupyterhub  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
        import requests  # noqa: F401
        import websocket  # noqa: F401
    except ImportError as exc:
        return f"the hub extra is not installed ({exc.name}): run `make hub-deps`"
    if not HUB.exists() or not PROXY.exists():
        return f"{HUB if not HUB.exists() else PROXY} is missing: run `make hub-deps`"
    if missing_browser():
        return f"the lure needs a browser: {missing_browser()}"
    for tool in ("ip", "nft", "useradd", "userdel", "openssl"):
        if not shutil.which(tool):
            return f"`{tool}` is missing (Debian: iproute2, nftables, passwd, openssl)"
    return None


@pytest.fixture(autouse=True)
def _hub_requirements():
    skip_or_fail(_missing_requirements(), "COURSE_REQUIRE_HUB", "the hub test")
    with names_on_this_machine(DOMAIN):
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What ada's kernel tries (paths filled in by the test); each value says what happened.
PROBE = """
import json, os, pwd

def attempt(action, path):
    try:
        action(path)
        return "allowed"
    except OSError as error:
        return type(error).__name__

def read(path):
    with open(path, "rb") as f:
        f.read(1)

def append(path):
    with open(path, "ab"):
        pass

def listing(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else "absent"

print(json.dumps({
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "own lesson": attempt(read, os.path.expanduser("~/notebooks/01_collectives.ipynb")),
    "grace's lesson": attempt(read, GRACE_HOME + "/notebooks/01_collectives.ipynb"),
    "hub state": [attempt(read, STATE + "/" + name) for name in ("api_token", "cookie_secret", "jupyterhub.sqlite")],
    "solutions": listing(REPO + "/solutions"),
    "tests": listing(REPO + "/tests"),
    "git": listing(REPO + "/.git"),
    "lessons": len(listing(REPO + "/notebooks")),
    "exercises": len(listing(REPO + "/exercises")),
    "course listed": listing(REPO),
    "planted": {path: attempt(read, path) for path in PLANTED},
    "course_lib": __import__("course_lib").__file__,
    "write the course": attempt(append, REPO + "/" + MARK),
    "write the library": attempt(append, REPO + "/course_lib/__init__.py"),
    "write the kernel set-up": attempt(append, REPO + "/.venv/etc/ipython/ipython_kernel_config.py"),
    "var tmp": listing("/var/tmp"),
    "run lock": listing("/run/lock"),
    "dev shm": listing("/dev/shm"),
    "write var tmp": attempt(append, "/var/tmp/" + MARK),
    "write run lock": attempt(append, "/run/lock/" + MARK),
    "write dev shm": attempt(append, "/dev/shm/" + MARK),
    "process owners": sorted({os.stat("/proc/" + pid).st_uid for pid in os.listdir("/proc") if pid.isdigit()}),
    "hub listed": os.path.exists("/proc/" + str(HUB_PID)),
}))
"""

LISTEN = """
import json, socket, psutil
listener = socket.socket()
listener.bind(("0.0.0.0", 0))
listener.listen()
port = listener.getsockname()[1]
with socket.create_connection(("127.0.0.1", port), timeout=5):
    pass  # it does listen: grace herself can connect
print(json.dumps({"port": port, "address": psutil.net_if_addrs()["eth0"][0].address}))
"""

CONNECT = """
import json, socket

def connect(address):
    try:
        with socket.create_connection((address, PORT), timeout=5):
            return "connected"
    except OSError as error:
        return type(error).__name__

print(json.dumps({"loopback": connect("127.0.0.1"), "grace's address": connect(ADDRESS)}))
"""

# The machine's end of the learner's link (her address less one: a /30).
MACHINE_END = """
import ipaddress, json, psutil
print(json.dumps(str(ipaddress.ip_address(psutil.net_if_addrs()["eth0"][0].address) - 1)))
"""

# Ports the machine listens on, tried from a learner's namespace; and whether she may change its firewall.
REACH_THE_MACHINE = """
import json, socket, subprocess

def connect(address, port):
    try:
        with socket.create_connection((address, port), timeout=5):
            return "connected"
    except OSError as error:
        return type(error).__name__

capabilities = [line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0]
flush = subprocess.run(["/usr/sbin/nft", "flush", "ruleset"], capture_output=True, text=True)
print(json.dumps({"any address": connect(MACHINE, PORTS[0]), "the link's address": connect(MACHINE, PORTS[1]),
                  "cloud metadata": connect("169.254.169.254", 80),
                  "capabilities": capabilities, "flush the firewall": flush.returncode}))
"""

# grace trains on 4 ranks (all-reduces of a gradient-sized tensor, 30 s) while ada attacks.
TRAIN = """
import time, torch, torch.distributed as dist
from course_lib import launch

def train(seconds):
    # Rank 0's clock decides when to stop, and every rank hears it, so all run the same all-reduces.
    grad, go, steps, started = torch.ones(1 << 18), torch.ones(1), 0, time.monotonic()
    while True:
        go.fill_(float(time.monotonic() - started < seconds))
        dist.broadcast(go, src=0)
        if go.item() == 0:
            return steps, grad[0].item()
        dist.all_reduce(grad)
        grad.div_(dist.get_world_size())
        steps += 1

results = launch(train, world_size=4, args=(30,), timeout=120)
assert all(value == 1.0 for _, value in results), results
print("trained", min(steps for steps, _ in results), "steps")
"""

MEMORY_HOG = """
import json, subprocess, sys
hog = subprocess.run([sys.executable, "-c", "b = b'1' * (3 << 30)"])
print(json.dumps({"returncode": hog.returncode}))
"""

FORK_BOMB = """
import json, subprocess, sys
bomb = (  # each child lets go of the pipes and sleeps; a safety net of 2,000 processes under the cgroup's limit
    "import os, resource, time\\n"
    "resource.setrlimit(resource.RLIMIT_NPROC, (2000, 2000))\\n"
    "forked = 0\\n"
    "try:\\n"
    "    while True:\\n"
    "        if os.fork() == 0:\\n"
    "            quiet = os.open(os.devnull, os.O_WRONLY)\\n"
    "            os.dup2(quiet, 1)\\n"
    "            os.dup2(quiet, 2)\\n"
    "            time.sleep(300)\\n"
    "            os._exit(0)\\n"
    "        forked += 1\\n"
    "except OSError as error:\\n"
    "    print(forked, error.errno)\\n"
)
done = subprocess.run([sys.executable, "-c", bomb], capture_output=True, text=True, timeout=120)
forked, errno = done.stdout.split()
print(json.dumps({"forked": int(forked), "errno": int(errno)}))
"""


def _processes_of(hub_process: psutil.Process, homes: Path) -> list[psutil.Process]:
    """The hub, everything it started, and anything running as a learner's user."""
    found = {hub_process.pid: hub_process} if hub_process.is_running() else {}
    try:
        found.update({p.pid: p for p in hub_process.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    for process in psutil.process_iter():
        try:
            if process.username().startswith(TEST_PREFIX) or process.environ().get("HOME", "").startswith(str(homes)):
                found[process.pid] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, KeyError):
            continue
    return [p for p in found.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _learner_tag(state: Path, name: str) -> str:
    """What the hub's spawner names a learner's namespace and cgroups after (LearnerSpawner._tag)."""
    return hashlib.sha256(f"{state.resolve()}{name}".encode()).hexdigest()[:8]


def _certificate(folder: Path) -> tuple[Path, Path]:
    from hub_client import loopback_certificate

    return loopback_certificate(folder)


def _remove_users():
    remove_users([*LEARNERS, ADMIN], TEST_PREFIX)


def _test_users_and_groups() -> list[str]:
    """The machine's users and groups with the test's prefix (none before and after the test)."""
    found = []
    for database in ("passwd", "group"):
        listed = subprocess.run(["getent", database], capture_output=True, text=True, timeout=60).stdout
        found += [f"{database}:{line.split(':')[0]}" for line in listed.splitlines() if line.startswith(TEST_PREFIX)]
    return found


def _plant_in_course(mark: str) -> list[Path]:
    """Files an instructor may keep in the course's folder, which no learner may see: collected
    submissions, the roster, grades, and a file nobody thought of. Only names not there already
    (the test removes what it made, and only that); the made paths, deepest first."""
    made = []
    for relative in (f"SUBMISSIONS/{mark}/01_collectives.ipynb", "roster.txt", "grades.csv", f"{mark}.txt"):
        path = REPO / relative
        if any(p.exists() for p in [path, *path.parents][: len(Path(relative).parts)]):
            continue  # (the instructor's own: left alone)
        for folder in reversed(path.parents[: len(Path(relative).parts) - 1]):
            folder.mkdir()
            made.append(folder)
        path.write_text(f"{mark}: planted by the hub's test; no learner may read it\n")
        made.append(path)
    return made[::-1]


def _remove_planted(made: list[Path]) -> None:
    for path in made:
        path.rmdir() if path.is_dir() else path.unlink(missing_ok=True)


# What a page of ada's tries in the browser of whoever opens it: each attempt's outcome, "read ..." or
# "refused: ...". The same function runs as the lure on ada's origin, and on grace's own as the control.
TRY_AS_THE_VISITOR = """async (hub, grace) => {
  // The XSRF token JupyterLab sends with each request: the page's own _xsrf cookie, where it has one.
  const cookie = document.cookie.split("; ").find(each => each.startsWith("_xsrf="));
  const token = cookie ? decodeURIComponent(cookie.slice(6)) : "";
  const seen = {};
  const attempt = async (what, url) => {
    try {
      const reply = await fetch(url, {credentials: "include", headers: token ? {"X-XSRFToken": token} : {}});
      seen[what] = `read ${reply.status} ${(await reply.text()).slice(0, 120)}`;
    } catch (error) { seen[what] = `refused: ${error.name}`; }
  };
  await attempt("this page", location.href);
  await attempt("grace's files", grace + "/api/contents");
  await attempt("the hub as grace", hub + "/hub/api/user");
  // A write the browser sends from any page without asking grace's server first (a "simple" request:
  // POST, text/plain), its XSRF token in the query: a new untitled file in grace's notebooks/.
  try {
    await fetch(`${grace}/api/contents/notebooks?_xsrf=${encodeURIComponent(token)}`, {method: "POST",
      mode: "no-cors", credentials: "include", headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({type: "file", ext: ".txt"})});
    seen["a file written as grace"] = "sent";
  } catch (error) { seen["a file written as grace"] = `refused: ${error.name}`; }
  return seen;
}"""

# ada's ~/.jupyter makes her server serve a folder of hers, as static files, to anyone.
LURE_CONFIG = """
import os, pathlib
folder = pathlib.Path.home() / "lure"
folder.mkdir(exist_ok=True)
(folder / "lure.html").write_text(PAGE)
config = pathlib.Path.home() / ".jupyter"
config.mkdir(exist_ok=True)
(config / "jupyter_server_config.py").write_text(f"c.ServerApp.extra_static_paths = [{str(folder)!r}]\\n")
print('"written"')
"""


def _ada_lures_grace(url: str, instructor: Hub, learners: dict, passwords: dict, homes: Path) -> None:
    """A page from ada's server, opened in grace's browser while grace is logged in, acts as nobody but ada."""
    from playwright.sync_api import sync_playwright

    ada, grace_url = learners["ada"], user_url(url, "grace")
    grace_notebooks = homes / f"{TEST_PREFIX}grace" / "notebooks"
    untitled = lambda: sorted(p.name for p in grace_notebooks.glob("untitled*"))  # noqa: E731
    assert untitled() == []
    # First the lure tosses an _xsrf cookie of its own onto every host of the domain (a page may set a cookie
    # for its parent domain), hoping grace's server takes it for hers; then it tries as grace.
    toss = (f"document.cookie = '_xsrf=forged-by-ada; domain={DOMAIN}; path=/; secure'; "
            "window.tossed = document.cookie.includes('forged-by-ada');")
    page_html = (f"<!doctype html><title>lure</title><body><script>{toss} ({TRY_AS_THE_VISITOR})({url!r}, "
                 f"{grace_url!r}).then(seen => {{ window.lured = {{...seen, tossed: window.tossed}}; }});</script></body>")
    writer = Kernel(ada, "ada", "lure.ipynb")
    assert writer.json(f"PAGE = {page_html!r}" + LURE_CONFIG) == "written"
    writer.close()
    ada.http.delete(f"{url}/hub/api/users/ada/server", timeout=120).raise_for_status()  # her server, restarted
    ada.wait_until("ada's server stopped", lambda: ada.server("ada") is None, 120)
    ada.http.post(f"{url}/hub/api/users/ada/server", timeout=300).raise_for_status()
    ada.wait_until("ada's server is ready again", lambda: (ada.server("ada") or {}).get("ready"), 300)
    import requests

    lure = f"{user_url(url, 'ada')}/static/lure.html"
    served = requests.get(lure, verify=ada.http.verify, timeout=60)  # to anyone, with no login
    assert served.status_code == 200 and "grace's files" in served.text, served.status_code
    # No page of the hub's or of a server's may be shown in a frame (JupyterHub's policy), on any origin.
    for page in (f"{url}/hub/login", f"{grace_url}/lab"):
        policy = requests.get(page, verify=ada.http.verify, timeout=60).headers.get("Content-Security-Policy", "")
        assert "frame-ancestors 'none'" in policy, (page, policy)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            visitor = browser.new_context(ignore_https_errors=True).new_page()
            visitor.goto(f"{url}/hub/login", timeout=120_000)  # grace logs in, and her lab opens
            visitor.fill("#username_input", "grace")
            visitor.fill("#password_input", passwords["grace"])
            visitor.click("#login_submit")
            visitor.wait_for_url(f"{grace_url}/lab**", timeout=300_000)
            control = visitor.evaluate(f"({TRY_AS_THE_VISITOR})({url!r}, {grace_url!r})")
            written = ada.wait_until("the control's write, with grace's own token", untitled, 30)
            visitor.goto(lure, timeout=120_000)  # the link ada sent her
            visitor.wait_for_function("window.lured !== undefined", timeout=120_000)
            lured = visitor.evaluate("window.lured")
        finally:
            browser.close()
    print("grace's own page:", control)
    print("ada's page in grace's browser:", lured)
    # On grace's own origin the attempts read her files (her login works in this browser): the control.
    assert control["grace's files"].startswith('read 200 {"name"'), control
    assert len(written) == 1, written  # (grace's own page may write to her server: the control)
    # ada's page ran (it read itself, and tossed its cookie), and got nothing of grace's or of the hub's, and
    # wrote nothing into grace's files.
    assert lured["this page"].startswith("read 200") and lured["tossed"] is True, lured
    for attempt in ("grace's files", "the hub as grace"):
        assert lured[attempt].startswith("refused"), (attempt, lured)
    assert untitled() == written  # (the page waited for each reply before it reported), (untitled(), written)


def _ada_asks_for_more_than_her_own(url: str, ada: Hub) -> None:
    """With her own token, ada asks the hub for rights she does not have: a token of grace's, a token of
    her own with the admin's scopes, grace's server started or stopped, the list of users, an admin flag;
    each is refused, and her token still works (the refusals are not a broken token's)."""
    asks = {
        "a token for grace": ("POST", "users/grace/tokens", {"note": "mine now"}),
        "an admin's token for herself": ("POST", "users/ada/tokens", {"scopes": ["admin:users", "access:servers"]}),
        "a token to grace's server": ("POST", "users/ada/tokens", {"scopes": ["access:servers!user=grace"]}),
        "grace's server stopped": ("DELETE", "users/grace/server", None),
        "a server started for grace": ("POST", "users/grace/servers/mine", None),
        "every user listed": ("GET", "users", None),
        "herself made admin": ("PATCH", "users/ada", {"admin": True}),
    }
    answers = {what: ada.http.request(method, f"{url}/hub/api/{path}", json=body, timeout=60).status_code
               for what, (method, path, body) in asks.items()}
    print("ada asks the hub:", answers)
    assert all(code in (400, 403, 404) for code in answers.values()), answers
    assert ada.api("GET", "user")["name"] == "ada" and not ada.api("GET", "user")["admin"]


def _ada_attacks(url, instructor, learners, homes, state, hub_pid: int, mark: str, planted: list[Path]) -> None:
    ada, grace = learners["ada"], learners["grace"]
    assert ada.http.get(f"{user_url(url, 'grace')}/api/contents", timeout=60).status_code == 403
    assert ada.http.get(f"{url}/hub/api/users/grace", timeout=60).status_code in (403, 404)
    _ada_asks_for_more_than_her_own(url, ada)
    probe = Kernel(ada, "ada", "probe.ipynb")
    seen = probe.json(f"GRACE_HOME, STATE, REPO = {str(homes / (TEST_PREFIX + 'grace'))!r}, {str(state)!r}, "
                      f"{str(REPO)!r}; HUB_PID, MARK = {hub_pid}, {mark!r}; "
                      f"PLANTED = {[str(p) for p in planted if p.is_file()]!r}" + PROBE)
    assert seen["user"] == TEST_PREFIX + "ada" and seen["own lesson"] == "allowed", seen
    assert seen["grace's lesson"] == "PermissionError", seen
    assert all(outcome != "allowed" for outcome in seen["hub state"]), seen
    assert all(seen[name] in ([], "absent") for name in ("solutions", "tests", "git")), seen
    assert seen["lessons"] >= 12 and seen["exercises"] >= 1, seen
    # Of the course's folder, only what a learner needs (COURSE_FOR_LEARNERS), read-only: what an
    # instructor keeps there, or adds later, is absent.
    assert planted and all(outcome == "FileNotFoundError" for outcome in seen["planted"].values()), seen
    assert set(seen["course listed"]) <= set(COURSE_FOR_LEARNERS), seen
    assert {"notebooks", "exercises", "course_lib", ".venv"} <= set(seen["course listed"]), seen
    assert seen["course_lib"] == str(REPO / "course_lib" / "__init__.py"), seen
    assert seen["write the course"] != "allowed", seen
    assert seen["write the library"] != "allowed" and seen["write the kernel set-up"] != "allowed", seen
    # Her own /var/tmp and /run/lock (the machine's files, MARK among them, out of sight; hers out of
    # the machine's), and a /proc that lists her own processes only.
    assert seen["var tmp"] == [homes.name] and seen["run lock"] == [] and seen["dev shm"] == [], seen
    assert seen["write var tmp"] == seen["write run lock"] == seen["write dev shm"] == "allowed", seen
    for folder in SCRATCH:
        assert (Path(folder) / mark).read_text() == "the machine's", folder
    assert seen["process owners"] == [pwd.getpwnam(TEST_PREFIX + "ada").pw_uid] and not seen["hub listed"], seen

    listening = Kernel(grace, "grace", "listen.ipynb")
    where = listening.json(LISTEN)
    tried = probe.json(f"PORT, ADDRESS = {where['port']}, {where['address']!r}" + CONNECT)
    assert tried["loopback"] == "ConnectionRefusedError" and tried["grace's address"] != "connected", tried
    _the_machine_is_out_of_reach(probe)

    training = Kernel(grace, "grace", "train.ipynb")
    training_request = training.send(TRAIN)
    time.sleep(3)  # grace's ranks are up
    hog = probe.json(MEMORY_HOG)
    assert hog["returncode"] == -signal.SIGKILL, hog  # the OOM killer, in ada's cgroup only
    bomb = probe.json(FORK_BOMB)
    assert bomb["errno"] == 11 and bomb["forked"] < 400, bomb  # EAGAIN at ada's process limit
    probe.send("import os; os.kill(-1, 9)")  # every process ada may signal: all of hers, nothing else
    trained, failure = training.wait(training_request)
    assert failure is None and "trained" in trained, (failure, trained)
    assert instructor.api("GET", "") is not None
    instructor.wait_until("ada's server ended by her kill -9 -1",
                          lambda: not (instructor.server("ada") or {}).get("ready"), 120)
    probe.close(delete=False)
    listening.close()
    training.close()


def _the_machine_is_out_of_reach(probe: Kernel) -> None:
    """The machine's services (a Slurm controller on 0.0.0.0:6817, say) and a cloud's metadata address
    refuse a learner: her namespace's firewall stops every connection she opens through her link, and
    she cannot change it."""
    machine = probe.json(MACHINE_END)
    with socket.socket() as everywhere, socket.socket() as on_the_link:
        everywhere.bind(("0.0.0.0", 0))
        on_the_link.bind((machine, 0))
        for listener in (everywhere, on_the_link):
            listener.listen()
        ports = [everywhere.getsockname()[1], on_the_link.getsockname()[1]]
        tried = probe.json(f"MACHINE, PORTS = {machine!r}, {ports!r}" + REACH_THE_MACHINE)
    assert tried["any address"] == tried["the link's address"] == "ConnectionRefusedError", tried
    # A cloud's metadata service (credentials of the machine's own, Zero to JupyterHub's warning) is out of reach too.
    assert tried["cloud metadata"] != "connected", tried
    assert int(tried["capabilities"], 16) == 0 and tried["flush the firewall"] != 0, tried


def _an_idle_kernel_is_culled(url, linus: Hub) -> None:
    idle = Kernel(linus, "linus", "idle.ipynb")
    idle.run("1 + 1")
    idle.close(delete=False)
    kernels = lambda: linus.http.get(f"{user_url(url, 'linus')}/api/kernels", timeout=60).json()  # noqa: E731
    assert kernels(), "the kernel should still be there"
    linus.wait_until("linus's idle kernel culled", lambda: kernels() == [], KERNEL_IDLE_S + 90)


def _the_guides_api_calls(tmp_path, url: str, token: str, cert, instructor) -> None:
    """docs/instructors.md, "Start servers ahead of time": every roster name is a user from the hub's start,
    and the guide's lines, run by bash as written, start ada's server, then stop it. In place of the
    example's: the test hub's address, its token in .hub/api_token (where the hub keeps it when
    HUB_API_TOKEN is not set), its certificate for curl, and, as root where sudo is not installed, a
    `sudo` that runs its command."""
    assert {name for name in LEARNERS} <= {user["name"] for user in instructor.api("GET", "users")}
    guide = (REPO / "docs" / "instructors.md").read_text()
    block = guide.split("* **Start servers ahead of time**", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    assert len(lines) == 3 and lines[0].startswith("TOKEN=$(sudo cat .hub/api_token); HUB=https://hub.example.org:8000/"), lines
    assert "ada/server" in lines[1] and "-X POST" in lines[1] and "ada/server" in lines[2] and "-X DELETE" in lines[2], lines
    setup = lines[0].replace("https://hub.example.org:8000", url)
    folder = tmp_path / "instructor"
    (folder / ".hub").mkdir(parents=True)
    (folder / ".hub" / "api_token").write_text(token)
    tools = folder / "bin"
    tools.mkdir()
    if shutil.which("sudo") is None:
        (tools / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
        (tools / "sudo").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "CURL_CA_BUNDLE": str(cert)}
    assert instructor.server("ada") is None
    for line, wanted in ((lines[1], "ada's server is ready"), (lines[2], "ada's server stopped")):
        run = subprocess.run(["bash", "-c", f"set -e\n{setup}\n{line}"], cwd=folder, env=env, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0 and '"status": 4' not in run.stdout, (line, run.stdout, run.stderr)
        if "POST" in line:
            instructor.wait_until(wanted, lambda: (instructor.server("ada") or {}).get("ready"), 300)
        else:
            instructor.wait_until(wanted, lambda: instructor.server("ada") is None, 120)


def _hand_in_and_grade(tmp_path, homes, env, learners: dict) -> None:
    """docs/instructors.md's commands: grace and linus hand in with the guide's command in their own
    kernels, then go on editing; each learner's handed-in folder becomes SUBMISSIONS/<learner>/. ada
    hands in a link to grace's handed-in folder instead (she cannot read it, but may name it), hoping to
    be graded for grace's work, or to have the root-run collection write into grace's home."""
    guide = (REPO / "docs" / "instructors.md").read_text().splitlines()
    hand_in = [line.strip() for line in guide if line.strip().startswith("python -m course_lib.hand_in")]
    assert len(hand_in) == 1, hand_in
    for name in ("grace", "linus"):
        kernel = Kernel(learners[name], name, "hand-in.ipynb")
        said = kernel.json(f"import json, os, pathlib, subprocess; home = os.path.expanduser('~'); "
                           f"run = subprocess.run(['bash', '-c', {hand_in[0]!r}], cwd=home, capture_output=True, text=True); "
                           f"pathlib.Path(home, 'exercises', 'after-handing-in.ipynb').write_text('{{}}'); "
                           f"print(json.dumps([run.returncode, run.stdout + run.stderr]))")
        assert said[0] == 0 and "handed in" in said[1] and "in " + str(homes) in said[1], said
        kernel.close()
    grace_handed_in = homes / f"{TEST_PREFIX}grace" / "handed-in"
    swap = Kernel(learners["ada"], "ada", "swap.ipynb")
    assert swap.json(f"import os, json; home = os.path.expanduser('~'); "
                     f"os.symlink({str(grace_handed_in)!r}, home + '/handed-in'); "
                     f"print(json.dumps(os.readlink(home + '/handed-in')))") == str(grace_handed_in)
    swap.close()
    before = sorted(p.name for p in grace_handed_in.iterdir())
    submissions, exercises = tmp_path / "SUBMISSIONS", tmp_path / "exercises"
    exercises.mkdir()
    shutil.copy(REPO / "exercises" / LESSON, exercises)
    collect = "\n".join(line.strip() for line in guide if line.strip().startswith(("mkdir SUBMISSIONS", "for home in")))
    assert collect.count("\n") == 1, collect
    subprocess.run(["bash", "-c", collect], cwd=tmp_path, env={**os.environ, **env, "HUB_HOMES": str(homes)},
                   check=True)
    assert (submissions / "ada").is_symlink()  # `cp -r` copies her link as a link, not grace's files
    handed = sorted(["HANDED_IN.txt", *(p.name for p in (REPO / "exercises").glob("*.ipynb"))])
    for name in ("grace", "linus"):  # what was handed in (every exercise), not what was written after
        assert sorted(p.name for p in (submissions / name).iterdir()) == handed
    graded = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(submissions),
                             "--exercises", str(exercises)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert f"{submissions / 'ada'} is a symbolic link, not a student's folder: not graded" in graded.stderr, graded.stderr
    with open(submissions / "grades.csv") as f:
        rows = {row["student"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"grace", "linus"}, rows  # ada: not graded, and not for grace's work
    for name in ("grace", "linus"):  # untouched exercises: nothing earned, but graded and explained
        assert float(rows[name]["total"]) == 0 and float(rows[name]["max"]) > 0, rows[name]
        assert "FAILED" in (submissions / name / "feedback.txt").read_text()
    assert sorted(p.name for p in grace_handed_in.iterdir()) == before  # nothing written into grace's home


@pytest.mark.timeout(1500)
def test_a_class_logs_in_runs_a_lesson_hands_in_and_stays_apart(tmp_path):
    import requests
    from hub_logins import handed_out

    state, port, token = tmp_path / "hub", _free_port(), secrets.token_hex(32)
    homes = Path(tempfile.mkdtemp(prefix="course-hub-homes-", dir="/var/tmp"))
    homes.chmod(0o711)  # learners reach their own home through it
    roster = tmp_path / "roster.txt"
    roster.write_text("# the class\n" + "\n".join(LEARNERS) + "\n")
    cert, key = _certificate(tmp_path)
    mark = f"hubtest-{secrets.token_hex(4)}"  # a file of the machine's in /var/tmp, /run/lock and /dev/shm
    for folder in SCRATCH:
        (Path(folder) / mark).write_text("the machine's")
    planted = _plant_in_course(mark)
    env = {"HUB_PORT": str(port), "HUB_IP": "127.0.0.1", "HUB_STATE": str(state),
           "HUB_API_TOKEN": token, "HUB_ROSTER": str(roster), "HUB_ADMIN": ADMIN, "HUB_HOMES": str(homes),
           "HUB_SSL_CERT": str(cert), "HUB_SSL_KEY": str(key), "HUB_CPUS_PER_LEARNER": "1",
           "HUB_MEMORY_PER_LEARNER": "2G", "HUB_PROCESSES_PER_LEARNER": "400",
           "HUB_KERNEL_IDLE_SECONDS": str(KERNEL_IDLE_S), "HUB_USER_PREFIX": TEST_PREFIX, "HUB_DOMAIN": DOMAIN}
    _remove_users()  # (left by an earlier run that was killed: the test's own users only)
    process = start_hub(env, tmp_path / "hub.log")
    hub_process = psutil.Process(process.pid)
    url = f"https://{DOMAIN}:{port}"
    instructor = Hub(url, token, str(cert))

    timings, started = {}, time.monotonic()
    try:
        instructor.wait_until("the hub answers over HTTPS", lambda: instructor.api("GET", "") is not None, 90)
        assert {"instructor", "idle-culler"} <= {s["name"] for s in instructor.api("GET", "services").values()}
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/hub/login", timeout=10)  # plain HTTP: no answer

        # Logins: the passwords the hub handed out; a wrong one, or a name off the roster, is refused.
        passwords = handed_out(state)
        learners = {name: learner_hub(url, name, passwords[name], str(cert)) for name in LEARNERS}
        assert log_in(url, "ada", passwords["ada"] + "x", str(cert))[0].status_code != 302
        assert log_in(url, "mallory", secrets.token_urlsafe(12), str(cert))[0].status_code != 302
        response, admin = log_in(url, ADMIN, passwords[ADMIN], str(cert))
        assert response.status_code == 302
        assert admin.get(f"{url}/hub/admin", timeout=60).status_code == 200

        for name, hub in learners.items():
            hub.http.post(f"{url}/hub/api/users/{name}/server", timeout=300).raise_for_status()
        for name, hub in learners.items():
            hub.wait_until(f"{name}'s server is ready", lambda: (hub.server(name) or {}).get("ready"), 300)
        timings["hub and 3 servers up"] = time.monotonic() - started
        # The instructor's login opens no learner's server (docs/instructors.md, "Read a learner's work"): a page
        # of the learner's would run the learner's JavaScript on the hub's origin with the instructor's rights.
        for path in ("lab", "api/contents", f"files/notebooks/{LESSON}"):
            reply = admin.get(f"{user_url(url, 'ada')}/{path}", timeout=60)
            assert reply.status_code == 403 and "nbformat" not in reply.text, (path, reply.status_code, reply.url)
        assert admin.get(f"{url}/hub/admin", timeout=60).status_code == 200  # the admin page still
        reply = learners["grace"].http.get(f"{user_url(url, 'ada')}/lab", timeout=60)  # nor does a classmate's
        assert reply.status_code == 403, (reply.status_code, reply.url)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        assert all(f"course-{_learner_tag(state, name)}" in listed for name in LEARNERS), listed  # named as expected
        for name in LEARNERS:  # each learner's own user, private home and copy of the course
            user = pwd.getpwnam(f"{TEST_PREFIX}{name}")
            home = Path(user.pw_dir)
            assert home.parent == homes and home.stat().st_mode & 0o777 == 0o700 and home.stat().st_uid == user.pw_uid
            assert (home / "notebooks" / LESSON).exists() and (home / "exercises" / LESSON).exists()
            assert psutil.Process(instructor.server(name)["state"]["pid"]).uids().real == user.pw_uid

        started = time.monotonic()
        with ThreadPoolExecutor(len(LEARNERS)) as pool:
            outcomes = list(pool.map(lambda name: run_notebook(learners[name], name, REPO / "notebooks" / LESSON),
                                     LEARNERS))
        timings[f"{LESSON} in 3 learners at once"] = time.monotonic() - started
        for outcome in outcomes:
            assert outcome["failure"] is None and outcome["failed"] == 0 and outcome["passed"] > 0, outcome

        started = time.monotonic()
        _hand_in_and_grade(tmp_path, homes, env, learners)
        timings["collect and grade"] = time.monotonic() - started

        started = time.monotonic()
        _ada_lures_grace(url, instructor, learners, passwords, homes)
        timings["ada's lure"] = time.monotonic() - started

        started = time.monotonic()
        _ada_attacks(url, instructor, learners, homes, state, process.pid, mark, planted)
        timings["ada's attacks"] = time.monotonic() - started

        started = time.monotonic()
        _an_idle_kernel_is_culled(url, learners["linus"])
        timings["an idle kernel culled"] = time.monotonic() - started

        started = time.monotonic()
        for name in LEARNERS:
            instructor.http.delete(f"{url}/hub/api/users/{name}/server", timeout=120)
        for name in LEARNERS:
            instructor.wait_until(f"{name}'s server stopped", lambda: instructor.server(name) is None, 120)

        started = time.monotonic()
        _the_guides_api_calls(tmp_path, url, token, cert, instructor)
        timings["the guide's API calls"] = time.monotonic() - started
    finally:
        before_stop = _processes_of(hub_process, homes)
        stop_hub(process)
        psutil.wait_procs([p for p in before_stop if p.pid != process.pid], timeout=15)
        left = _processes_of(hub_process, homes)
        for leftover in left:
            leftover.kill()
        # This hub's own (another hub on the machine, a live class's, keeps its namespaces and cgroups).
        tags = [_learner_tag(state, name) for name in [*LEARNERS, ADMIN]]
        namespaces = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                                  text=True).stdout.splitlines()
                      if line.split() and line.split()[0] in {f"course-{tag}" for tag in tags}]
        cgroups = [str(path) for tag in tags for path in Path("/sys/fs/cgroup").rglob(f"course-hub-{tag}")]
        _remove_users()
        users_left = _test_users_and_groups()
        shutil.rmtree(homes, ignore_errors=True)
        for folder in SCRATCH:
            (Path(folder) / mark).unlink(missing_ok=True)
        _remove_planted(planted)
    timings["stop"] = time.monotonic() - started
    print("; ".join(f"{what} {seconds:.0f} s" for what, seconds in timings.items()))
    assert not left, "left running: " + "; ".join(" ".join(p.cmdline())[:100] for p in left)
    assert not namespaces, namespaces
    assert not cgroups, cgroups
    assert not users_left, users_left
    assert process.returncode is not None


USERS = "[c.LearnerSpawner.user_prefix + name for name in sorted(c.Authenticator.allowed_users)]"


def _load_config(env: dict, show: str = USERS) -> subprocess.CompletedProcess:
    """Load jupyter/jupyterhub_config.py as the hub does, with only these HUB_* settings; on success
    it prints ``show`` (by default the Unix users the roster's names would get), as JSON."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("HUB_")}
    load = ("import json, sys; from traitlets.config import Config; path = sys.argv[1]; names = {'get_config': Config, "
            "'__file__': path}; exec(compile(open(path).read(), path, 'exec'), names); c = names['c']; "
            f"print(json.dumps({show}))")
    return subprocess.run([sys.executable, "-c", load, str(REPO / "jupyter" / "jupyterhub_config.py")],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("settings, says", [
    ({}, "HUB_ROSTER is not set"),
    ({"HUB_ROSTER": "/nonexistent/roster.txt"}, "no such file"),
    ({"HUB_ROSTER": "ROSTER", "HUB_ADMIN": "Bad Name"}, "HUB_ADMIN='Bad Name' is not a user name"),
    ({"HUB_ROSTER": "ROSTER", "HUB_SSL_CERT": "CERT"}, "HUB_SSL_KEY is missing or not a file"),
    ({"HUB_ROSTER": "ROSTER", "HUB_IP": ""}, "The hub would serve plain HTTP to the network"),
    ({"HUB_ROSTER": "ROSTER", "HUB_IP": "0.0.0.0"}, "The hub would serve plain HTTP to the network"),
    ({"HUB_ROSTER": "ROSTER", "HUB_USER_PREFIX": "Bad Prefix"}, "HUB_USER_PREFIX='Bad Prefix' cannot start"),
    ({"HUB_ROSTER": "TEST_USER_ROSTER"}, "are not user names the hub can make"),
    ({"HUB_ROSTER": "ROSTER", "HUB_DOMAIN": ""}, "HUB_DOMAIN is not set"),
    ({"HUB_ROSTER": "ROSTER", "HUB_DOMAIN": "localhost"}, "HUB_DOMAIN='localhost' is not a DNS name"),
    ({"HUB_ROSTER": "ROSTER", "HUB_SSL_CERT": "HUB_ONLY_CERT", "HUB_SSL_KEY": "HUB_ONLY_KEY"},
     f"not for *.{DOMAIN}: the hub answers at {DOMAIN} and each learner at NAME.{DOMAIN}"),
    ({"HUB_ROSTER": "ROSTER", "HUB_SSL_CERT": "HUB_ONLY_CERT", "HUB_SSL_KEY": "READABLE_KEY"},
     "may be read by other users, learners included"),
])
def test_bad_settings_get_a_clear_error_before_anything_starts(tmp_path, settings, says):
    roster = tmp_path / "roster.txt"
    roster.write_text("ada\n")
    test_user_roster = tmp_path / "test-users.txt"  # a roster naming one of the test's users
    test_user_roster.write_text(f"ada\n{TEST_PREFIX}grace\n")
    (tmp_path / "cert.pem").write_text("")
    hub_only = tmp_path / "hub-only"  # a certificate for the hub's name, not for its learners' (*.DOMAIN)
    hub_only.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={DOMAIN}",
                    "-addext", f"subjectAltName=DNS:{DOMAIN}", "-keyout", str(hub_only / "key.pem"),
                    "-out", str(hub_only / "cert.pem")], check=True, capture_output=True, timeout=60)
    readable_key = tmp_path / "readable-key.pem"  # a key as /etc/ssl's files often are: mode 644
    shutil.copy(hub_only / "key.pem", readable_key)
    readable_key.chmod(0o644)
    files = {"ROSTER": str(roster), "TEST_USER_ROSTER": str(test_user_roster), "CERT": str(tmp_path / "cert.pem"),
             "HUB_ONLY_CERT": str(hub_only / "cert.pem"), "HUB_ONLY_KEY": str(hub_only / "key.pem"),
             "READABLE_KEY": str(readable_key)}
    values = {name: files.get(value, value) for name, value in settings.items()}
    loaded = _load_config({"HUB_STATE": str(tmp_path / "state"), "HUB_IP": "127.0.0.1", "HUB_DOMAIN": DOMAIN, **values})
    assert loaded.returncode != 0 and says in loaded.stderr, loaded.stderr[-2000:]
    assert "Traceback" not in loaded.stderr, loaded.stderr[-2000:]


def test_two_hubs_on_one_server_hand_out_distinct_learner_addresses(tmp_path):
    """A hub holds its range of learner addresses while it runs: a second hub takes another, and
    where none is left it refuses, saying so (the test holds only one range: a hub started beside
    it still starts). It holds its user prefix too: a second hub with the same one refuses."""
    import json

    from hub_spawner import LEARNER_RANGES, claim_network, claim_users, release_networks

    roster = tmp_path / "roster.txt"
    roster.write_text("ada\n")
    settings = {"HUB_STATE": str(tmp_path / "state"), "HUB_IP": "127.0.0.1", "HUB_ROSTER": str(roster),
                "HUB_DOMAIN": DOMAIN}
    try:
        held = claim_network()  # as the first hub on this server
        loaded = _load_config(settings, show="c.LearnerSpawner.network")
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        second = json.loads(loaded.stdout.strip().splitlines()[-1])
        assert second in LEARNER_RANGES and second != held, (held, second)
        with pytest.raises(RuntimeError, match="held by another hub on this server: stop one"):
            claim_network([held])  # (every range held: the hub refuses to start, saying so)
        # Two classes with the same user prefix would share Unix users, homes and servers: refused.
        claim_users(f"{TEST_PREFIX}2-")  # as the first hub
        again = _load_config({**settings, "HUB_USER_PREFIX": f"{TEST_PREFIX}2-"}, show="c.LearnerSpawner.network")
        assert again.returncode != 0 and f"another hub on this server makes its learners' users as {TEST_PREFIX}2-NAME" \
            in again.stderr, again.stderr[-2000:]
        other = _load_config({**settings, "HUB_USER_PREFIX": f"{TEST_PREFIX}3-"}, show="c.LearnerSpawner.network")
        assert other.returncode == 0, other.stderr[-2000:]
    finally:
        release_networks()
    shutil.rmtree(tmp_path / "state")


def test_no_roster_name_is_one_of_the_tests_users(tmp_path):
    """The hub's tests remove the users they made, TEST_PREFIX + NAME: a real class, whatever its
    roster, never has one of them (with the default prefix, or any prefix without a '.')."""
    import json

    roster = tmp_path / "roster.txt"  # the longest and oddest names a roster may hold
    roster.write_text("ada\nhubtest\nhubtest-grace\nhubtest_linus\nz" + "9" * 19 + "\na-_\n")
    for prefix in ("", "hubtest", "hubtest-", "course_"):
        loaded = _load_config({"HUB_STATE": str(tmp_path / "state"), "HUB_IP": "127.0.0.1", "HUB_ROSTER": str(roster),
                               "HUB_ADMIN": "teacher", "HUB_USER_PREFIX": prefix, "HUB_DOMAIN": DOMAIN})
        assert loaded.returncode == 0, loaded.stderr[-2000:]
        users = json.loads(loaded.stdout.strip().splitlines()[-1])
        assert len(users) == 7 and all(len(user) <= 32 for user in users), users
        assert all(user.startswith(prefix or "jupyter-") for user in users), users
        assert not [user for user in users if user.startswith(TEST_PREFIX) or "." in user], users
    assert "." in TEST_PREFIX
    shutil.rmtree(tmp_path / "state")
