"""The class hub as its users see it, over HTTP: the instructor's REST API, a learner's login through
the form, a kernel of a learner's server through the proxy. Used by tests/test_hub.py and by
scripts/classroom_load.py --hub (which measures a class through the real hub)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "jupyter" / "jupyterhub_config.py"


class Hub:
    """The hub's REST API with one token: the instructor's service's, or a learner's own."""

    def __init__(self, url: str, token: str, verify: str | bool = True):
        import requests

        self.url, self.token = url, token
        self.http = requests.Session()
        self.http.trust_env = False  # else REQUESTS_CA_BUNDLE, where set, replaces the hub's certificate
        self.http.verify = verify
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

    def user_url(self, name: str) -> str:
        """Where a user's server answers: on an origin of the user's own, NAME.DOMAIN (HUB_DOMAIN)."""
        return user_url(self.url, name)


def user_url(hub_url: str, name: str) -> str:
    """The address of ``name``'s server, for a hub at ``hub_url`` (https://DOMAIN[:PORT]), as JupyterHub
    names it (its default subdomain hook)."""
    from urllib.parse import urlsplit

    from jupyterhub.utils import subdomain_hook_idna

    parts = urlsplit(hub_url)
    host = subdomain_hook_idna(name, parts.hostname, "user")
    return f"{parts.scheme}://{host}{'' if parts.port is None else f':{parts.port}'}/user/{name}"


@contextlib.contextmanager
def names_on_this_machine(domain: str):
    """In this process, DOMAIN and every NAME.DOMAIN resolve to this machine (127.0.0.1), as a browser
    resolves every *.localhost; other names as before. For a hub tried on one machine alone."""
    original = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if isinstance(host, bytes):
            host = host.decode()
        if isinstance(host, str) and (host == domain or host.endswith("." + domain)):
            host = "127.0.0.1"
        return original(host, *args, **kwargs)

    socket.getaddrinfo = resolve
    try:
        yield
    finally:
        socket.getaddrinfo = original


def start_hub(env: dict, log_path: Path) -> subprocess.Popen:
    """`make hub`'s command, with these HUB_* settings, its output to log_path."""
    log = open(log_path, "wb")
    hub = Path(sys.executable).parent / "jupyterhub"
    return subprocess.Popen([str(hub), "-f", str(CONFIG)], cwd=REPO, env={**os.environ, **env}, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def stop_hub(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)  # as Ctrl-C in make hub's terminal: every server stops with it
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def loopback_certificate(folder: Path, domain: str = "hub.localhost") -> tuple[Path, Path]:
    """A self-signed certificate and key for DOMAIN, *.DOMAIN (each learner's server) and 127.0.0.1, valid one
    day: a hub on this machine alone, as the tests and scripts/classroom_load.py start one (HTTPS only)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={domain}",
                    "-addext", f"subjectAltName=DNS:{domain},DNS:*.{domain},IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


def remove_users(names, prefix: str = "jupyter-") -> None:
    """The Unix users (their homes, and the groups of their own) the hub made for these learners
    (HUB_USER_PREFIX ``prefix``): only these, never another of the machine's users."""
    for name in names:
        subprocess.run(["userdel", "--remove", f"{prefix}{name}"], capture_output=True, timeout=60)


def log_in(url: str, name: str, password: str, verify: str | bool = True):
    """Log in through the login form, as a browser does; the response and the session."""
    import requests

    browser = requests.Session()
    browser.trust_env = False
    browser.verify = verify
    browser.get(f"{url}/hub/login", timeout=60).raise_for_status()
    response = browser.post(f"{url}/hub/login", timeout=60, allow_redirects=False,
                            data={"username": name, "password": password, "_xsrf": browser.cookies.get("_xsrf")})
    return response, browser


def learner_hub(url: str, name: str, password: str, verify: str | bool = True) -> Hub:
    """The learner's own API token, made with the session of a login through the form."""
    response, browser = log_in(url, name, password, verify)
    assert response.status_code == 302, f"{name} could not log in: {response.status_code} {response.text[:300]}"
    made = browser.post(f"{url}/hub/api/users/{name}/tokens", json={"note": "course"}, timeout=60,
                        headers={"X-XSRFToken": browser.cookies.get("_xsrf")})
    made.raise_for_status()
    return Hub(url, made.json()["token"], verify)


def _message(msg_type: str, content: dict, channel: str) -> dict:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "course", "session": "course",
                       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel, "buffers": []}


class Kernel:
    """A kernel of a learner's server, through the hub's proxy, with the learner's token."""

    def __init__(self, hub: Hub, learner: str, path: str, timeout_s: float = 300):
        import ssl

        import websocket

        self.hub, self.server = hub, hub.user_url(learner)
        response = hub.http.post(f"{self.server}/api/sessions", timeout=120, json={
            "path": path, "type": "notebook", "name": Path(path).name, "kernel": {"name": "python3"}})
        response.raise_for_status()
        self.session = response.json()
        channels = f"{self.server.replace('http', 'ws', 1)}/api/kernels/{self.session['kernel']['id']}/channels"
        verify = hub.http.verify
        sslopt = {"ca_certs": verify, "cert_reqs": ssl.CERT_REQUIRED} if isinstance(verify, str) else {}
        self.ws = websocket.create_connection(channels, header=[f"Authorization: token {hub.token}"],
                                              timeout=timeout_s, sslopt=sslopt)

    def send(self, code: str) -> str:
        request = _message("execute_request", {"code": code, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False,
                                               "stop_on_error": True}, "shell")
        self.ws.send(json.dumps(request))
        return request["header"]["msg_id"]

    def wait(self, msg_id: str) -> tuple[str, str | None]:
        """The text the request printed and its error (None if it ran to the end)."""
        text, failure, replied, idle = [], None, False, False
        while not (replied and idle):
            message = json.loads(self.ws.recv())
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "execute_reply":
                replied = True
                if content["status"] != "ok":
                    failure = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
            elif kind == "stream":
                text.append(content["text"])
            elif kind in ("execute_result", "display_data"):
                text.append(content.get("data", {}).get("text/plain", ""))
        return "".join(text), failure

    def run(self, code: str) -> str:
        text, failure = self.wait(self.send(code))
        assert failure is None, f"{self.server}: {failure}\n{text}"
        return text

    def json(self, code: str):
        """Run ``code``, which prints one JSON line last; that value."""
        return json.loads(self.run(textwrap.dedent(code)).strip().splitlines()[-1])

    def close(self, delete: bool = True) -> None:
        self.ws.close()
        if delete:
            self.hub.http.delete(f"{self.server}/api/sessions/{self.session['id']}", timeout=60)


def run_notebook(hub: Hub, learner: str, notebook: Path, timeout_s: float = 300) -> dict:
    """Run the learner's copy of a course notebook (notebooks/NAME in their home), cell by cell,
    in a kernel of their server, through the hub's proxy: how long, the first error, the checks."""
    started = time.monotonic()
    kernel = Kernel(hub, learner, f"{notebook.parent.name}/{notebook.name}", timeout_s)
    text, failure = [], None
    try:
        nb = nbformat.read(notebook, as_version=4)
        for number, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
            output, error = kernel.wait(kernel.send(cell.source))
            text.append(output)
            if error:
                failure = f"code cell {number}: {error}"
                break
    finally:
        kernel.close()
    output = "".join(text)
    return {"learner": learner, "seconds": time.monotonic() - started, "failure": failure,
            "passed": output.count("\u2714"), "failed": output.count("\u2718"),
            "clashes": output.count("Address already in use")}
