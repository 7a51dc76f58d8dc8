"""A class on one server: the course's JupyterHub (`make hub`), as an instructor runs it.

Starts the hub from jupyter/jupyterhub_config.py on a free port with its own state folder,
adds three learners through the REST API (the instructor's token), starts their servers, and
checks each server's limits (its cores; its memory cgroup where the hub can make one). Then
every learner runs chapter 01's lesson at the same moment, cell by cell, through the hub's URL
(the Jupyter server's REST API and the kernel's websocket, behind the proxy), with no error and
no failed check. Each learner's exercise notebook is collected from the learner's folder as
docs/instructors.md says and graded by scripts/grade.py (untouched: 0 points, and a feedback file). At the
end the servers and the hub are stopped and no process of theirs may be left.

Needs the `hub` extra and the proxy (`make hub-deps`); without them the test is skipped with
the reason, unless COURSE_REQUIRE_HUB=1 (CI), where it fails instead.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest
from optional import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "jupyter" / "jupyterhub_config.py"
PROXY = REPO / ".venv" / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
HUB = Path(sys.executable).parent / "jupyterhub"
LEARNERS = ["ada", "grace", "linus"]
LESSON = "01_collectives.ipynb"
CELL_TIMEOUT_S = 300


def _missing_requirements() -> str | None:
    try:
        import jupyterhub  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
        import requests  # noqa: F401
        import websocket  # noqa: F401
    except ImportError as exc:
        return f"the hub extra is not installed ({exc.name}): run `make hub-deps`"
    if not HUB.exists() or not PROXY.exists():
        return f"{HUB if not HUB.exists() else PROXY} is missing: run `make hub-deps`"
    return None


@pytest.fixture(autouse=True)
def _hub_requirements():
    skip_or_fail(_missing_requirements(), "COURSE_REQUIRE_HUB", "the hub test")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Hub:
    """The hub's REST API, as the instructor's service uses it."""

    def __init__(self, url: str, token: str):
        import requests

        self.url, self.token = url, token
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"token {token}"

    def api(self, method: str, path: str, **kwargs):
        response = self.http.request(method, f"{self.url}/hub/api/{path}", timeout=60, **kwargs)
        response.raise_for_status()
        return response.json() if response.content else None

    def wait_until(self, what: str, ready, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = ready()
                if value:
                    return value
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{what} within {timeout_s:g} s")

    def server(self, name: str) -> dict | None:
        return self.api("GET", f"users/{name}").get("servers", {}).get("")


def _message(msg_type: str, content: dict, channel: str) -> dict:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "test", "session": "hub-test",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": []}


def run_lesson(hub: Hub, learner: str) -> dict:
    """Run the learner's copy of the lesson in a kernel of their server, through the hub's proxy."""
    import websocket

    server = f"{hub.url}/user/{learner}"
    started = time.monotonic()
    response = hub.http.post(f"{server}/api/sessions", timeout=120, json={
        "path": f"notebooks/{LESSON}", "type": "notebook", "name": LESSON, "kernel": {"name": "python3"}})
    response.raise_for_status()
    session = response.json()
    channels = f"{server.replace('http', 'ws', 1)}/api/kernels/{session['kernel']['id']}/channels"
    ws = websocket.create_connection(channels, header=[f"Authorization: token {hub.token}"], timeout=CELL_TIMEOUT_S)
    text, failure = [], None
    try:
        nb = nbformat.read(REPO / "notebooks" / LESSON, as_version=4)
        for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
            request = _message("execute_request", {"code": cell.source, "silent": False, "store_history": True,
                                                   "user_expressions": {}, "allow_stdin": False,
                                                   "stop_on_error": True}, "shell")
            ws.send(json.dumps(request))
            replied = idle = False
            while not (replied and idle):
                message = json.loads(ws.recv())
                if message.get("parent_header", {}).get("msg_id") != request["header"]["msg_id"]:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind == "execute_reply":
                    replied = True
                    if content["status"] != "ok":
                        failure = f"code cell {number}: {content.get('ename')}: {content.get('evalue')}"
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
                elif kind == "stream":
                    text.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    text.append(content.get("data", {}).get("text/plain", ""))
            if failure:
                break
    finally:
        ws.close()
        hub.http.delete(f"{server}/api/sessions/{session['id']}", timeout=60)
    output = "".join(text)
    return {"learner": learner, "seconds": time.monotonic() - started, "failure": failure,
            "passed": output.count("\u2714"), "failed": output.count("\u2718")}


def _processes_of(hub_process: psutil.Process, state: Path) -> list[psutil.Process]:
    """The hub, everything it started, and anything running with a learner's home as HOME."""
    found = {hub_process.pid: hub_process} if hub_process.is_running() else {}
    try:
        found.update({p.pid: p for p in hub_process.children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    for process in psutil.process_iter():
        try:
            if process.environ().get("HOME", "").startswith(str(state)):
                found[process.pid] = process
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return [p for p in found.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_a_class_runs_a_lesson_and_hands_in_through_the_hub(tmp_path):
    state, port, token = tmp_path / "hub", _free_port(), secrets.token_hex(32)
    env = {**os.environ, "HUB_PORT": str(port), "HUB_IP": "127.0.0.1", "HUB_STATE": str(state),
           "HUB_API_TOKEN": token, "HUB_PASSWORD": secrets.token_urlsafe(12), "HUB_CPUS_PER_LEARNER": "1"}
    log = open(tmp_path / "hub.log", "wb")
    process = subprocess.Popen([str(HUB), "-f", str(CONFIG)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    hub_process = psutil.Process(process.pid)
    hub = Hub(f"http://127.0.0.1:{port}", token)
    timings = {}
    try:
        started = time.monotonic()
        hub.wait_until("the hub answers", lambda: hub.api("GET", "") is not None, 90)
        services = {s["name"] for s in hub.api("GET", "services").values()}
        assert {"instructor", "idle-culler"} <= services

        hub.api("POST", "users", json={"usernames": LEARNERS})
        for name in LEARNERS:
            hub.http.post(f"{hub.url}/hub/api/users/{name}/server", timeout=300).raise_for_status()
        for name in LEARNERS:
            hub.wait_until(f"{name}'s server is ready", lambda: (hub.server(name) or {}).get("ready"), 300)
        timings["hub and 3 servers up"] = time.monotonic() - started

        # Each learner: their own copy of the course, their own core, their own memory cgroup.
        cores = sorted(os.sched_getaffinity(0))
        for name in LEARNERS:
            home = state / "learners" / name
            assert (home / "notebooks" / LESSON).exists() and (home / "exercises" / LESSON).exists()
            pid = hub.server(name)["state"]["pid"]
            assert len(psutil.Process(pid).cpu_affinity()) == (1 if len(cores) > 1 else len(cores))
            cgroup_line = [line for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                           if "memory" in line.split(":")[1].split(",") or line.startswith("0::")][0]
            logged = (tmp_path / "hub.log").read_text()
            if f"Memory of {name} limited to" in logged:
                assert f"-{name}" in cgroup_line, cgroup_line
            else:
                assert f"Memory limit of {name} is advisory only" in logged

        started = time.monotonic()
        with ThreadPoolExecutor(len(LEARNERS)) as pool:
            outcomes = list(pool.map(lambda name: run_lesson(hub, name), LEARNERS))
        timings[f"{LESSON} in 3 learners at once"] = time.monotonic() - started
        for outcome in outcomes:
            assert outcome["failure"] is None and outcome["failed"] == 0 and outcome["passed"] > 0, outcome

        # Hand-in, with docs/instructors.md's commands: each learner's exercise folder becomes SUBMISSIONS/<learner>/.
        started = time.monotonic()
        submissions, exercises = tmp_path / "SUBMISSIONS", tmp_path / "exercises"
        exercises.mkdir()
        shutil.copy(REPO / "exercises" / LESSON, exercises)
        collect = ('mkdir SUBMISSIONS\n'
                   'for learner in "$HUB_STATE"/learners/*; do cp -r "$learner/exercises" '
                   '"SUBMISSIONS/$(basename "$learner")"; done')
        subprocess.run(["bash", "-c", collect], cwd=tmp_path, env={**env, "HUB_STATE": str(state)}, check=True)
        graded = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(submissions),
                                 "--exercises", str(exercises)], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert graded.returncode == 0, graded.stdout + graded.stderr
        with open(submissions / "grades.csv") as f:
            rows = {row["student"]: row for row in csv.DictReader(f)}
        assert set(rows) == set(LEARNERS)
        for name in LEARNERS:  # untouched exercises: nothing earned, but graded and explained
            assert float(rows[name]["total"]) == 0 and float(rows[name]["max"]) > 0, rows[name]
            assert "FAILED" in (submissions / name / "feedback.txt").read_text()
        timings["collect and grade"] = time.monotonic() - started

        started = time.monotonic()
        for name in LEARNERS:
            hub.http.delete(f"{hub.url}/hub/api/users/{name}/server", timeout=120).raise_for_status()
        for name in LEARNERS:
            hub.wait_until(f"{name}'s server stopped", lambda: hub.server(name) is None, 120)
    finally:
        before_stop = _processes_of(hub_process, state)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        _, alive = psutil.wait_procs([p for p in before_stop if p.pid != process.pid], timeout=15)
        left = _processes_of(hub_process, state)
        for leftover in left:
            leftover.kill()
    timings["stop"] = time.monotonic() - started
    print("; ".join(f"{what} {seconds:.0f} s" for what, seconds in timings.items()))
    assert not left, "left running: " + "; ".join(" ".join(p.cmdline())[:100] for p in left)
    assert process.returncode is not None
