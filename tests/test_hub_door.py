"""The class hub's front door (`make hub`, jupyter/jupyterhub_config.py, jupyter/hub_logins.py): who
may log in, how fast a stranger may guess, and what the hub's ports answer.

Starts the hub as an instructor would (every interface, HTTPS with a certificate made for the test,
a roster and an admin), with its own state folder and users of its own (prefix ``hubtest.d-``; no
learner server is started, so no user is made). Then:

* the hub handed out a password for every roster name and the admin, in HUB_STATE/logins.txt,
  root's, mode 600; a stranger's login as any of those names, or one off the roster, is refused;
* the handed-out password logs in, and every cookie the hub sets is Secure and HttpOnly;
* a name that failed too often is locked out (its right password too), with a message that says
  how long to wait;
* 50 wrong logins at once (their passwords hashed in a thread) slow the hub's API by at most 5x
  (median response time, against the same probe when idle);
* a try counts under the address the hub's proxy saw: headers a client writes (X-Real-Ip,
  X-Forwarded-For) do not make a locked-out address a new one;
* every port the hub, its proxy and its services listen on either speaks HTTPS alone (the public
  one) or listens on 127.0.0.1 alone.

Needs what tests/test_hub.py needs (root, `make hub-deps`).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import stat
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from test_hub import ADMIN, DOMAIN, TEST_PREFIX, _certificate, _free_port, _hub_requirements  # noqa: F401 (a fixture)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jupyter"))
from hub_client import Hub, log_in, start_hub, stop_hub  # noqa: E402

ROSTER = ["ada", "grace", "linus"]
DOOR_PREFIX = f"{TEST_PREFIX}d-"  # a hub holds its prefix: this one may run beside tests/test_hub.py's
FLOOD = 50


def _login_form(url: str, cert: str, headers: dict | None = None):
    """A browser at the login form (its _xsrf cookie set), ready to post; ``headers`` go with every request."""
    import requests

    browser = requests.Session()
    browser.trust_env = False
    browser.verify = cert
    browser.headers.update(headers or {})
    browser.get(f"{url}/hub/login", timeout=60).raise_for_status()
    return browser


def _post_login(browser, url: str, name: str, password: str):
    return browser.post(f"{url}/hub/login", timeout=120, allow_redirects=False,
                        data={"username": name, "password": password, "_xsrf": browser.cookies.get("_xsrf")})


def _cookie_flags(response) -> dict[str, set[str]]:
    """Each Set-Cookie of the response: {name: its attributes' names, lower-case}."""
    flags = {}
    for header in response.raw.headers.getlist("Set-Cookie"):
        name, *attributes = [part.strip() for part in header.split(";")]
        flags[name.split("=", 1)[0]] = {attribute.split("=", 1)[0].lower() for attribute in attributes}
    return flags


def _probe(sessions, url: str, keep_going) -> list[tuple[float, float]]:
    """GET /hub/api/ again and again from each session (a thread each) while ``keep_going()``:
    (when it was sent, how many seconds it took), for each."""
    def keep_probing(http):
        times = []
        while keep_going():
            sent = time.perf_counter()
            http.get(f"{url}/hub/api/", timeout=60).raise_for_status()
            times.append((sent, time.perf_counter() - sent))
        return times

    with ThreadPoolExecutor(len(sessions)) as pool:
        return [each for times in pool.map(keep_probing, sessions) for each in times]


def _listening(process: psutil.Process) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the hub and its children listen on."""
    found = set()
    for each in [process, *process.children(recursive=True)]:
        try:
            found |= {(c.laddr.ip, c.laddr.port) for c in each.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(found)


def _plain_http_answers(port: int) -> bool:
    import requests

    try:
        requests.get(f"http://127.0.0.1:{port}/hub/api/", timeout=10)
        return True
    except requests.exceptions.ConnectionError:
        return False


@pytest.fixture
def hub(tmp_path):
    state, port = tmp_path / "hub", _free_port()
    roster = tmp_path / "roster.txt"
    roster.write_text("\n".join(ROSTER) + "\n")
    cert, key = _certificate(tmp_path)
    env = {"HUB_PORT": str(port), "HUB_STATE": str(state), "HUB_ROSTER": str(roster), "HUB_ADMIN": ADMIN,
           "HUB_SSL_CERT": str(cert), "HUB_SSL_KEY": str(key), "HUB_API_TOKEN": secrets.token_hex(32),
           "HUB_HOMES": str(tmp_path / "homes"), "HUB_USER_PREFIX": DOOR_PREFIX, "HUB_DOMAIN": DOMAIN}
    env.pop("HUB_IP", None)  # the default: every interface, as a class has it
    process = start_hub(env, tmp_path / "hub.log")
    url = f"https://{DOMAIN}:{port}"
    instructor = Hub(url, env["HUB_API_TOKEN"], str(cert))
    try:
        instructor.wait_until("the hub answers over HTTPS", lambda: instructor.api("GET", "") is not None, 90)
        yield {"url": url, "cert": str(cert), "state": state, "process": psutil.Process(process.pid),
               "log": tmp_path / "hub.log"}
    finally:
        children = psutil.Process(process.pid).children(recursive=True)
        stop_hub(process)
        psutil.wait_procs(children, timeout=15)
        left = [child for child in children if child.is_running() and child.status() != psutil.STATUS_ZOMBIE]
        for child in left:
            child.kill()
        assert not left, left


@pytest.mark.timeout(600)
def test_only_handed_out_passwords_log_in_and_guessing_does_not_stall_the_hub(hub):
    from hub_logins import LOGINS, handed_out

    url, cert = hub["url"], hub["cert"]
    logins = hub["state"] / LOGINS
    mode = logins.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o600 and mode.st_uid == 0, oct(mode.st_mode)
    passwords = handed_out(hub["state"])
    assert set(passwords) == {*ROSTER, ADMIN} and len(set(passwords.values())) == len(passwords)

    # A stranger, as every name the hub knows (none has logged in yet) and one it does not: refused.
    for name in [*ROSTER, ADMIN, "mallory"]:
        response, _ = log_in(url, name, secrets.token_urlsafe(12), cert)
        assert response.status_code == 403, (name, response.status_code)
        assert "Invalid username or password" in response.text

    # The handed-out password logs in; every cookie the hub sets on the way is Secure and HttpOnly.
    browser = _login_form(url, cert)
    response = _post_login(browser, url, "ada", passwords["ada"])
    assert response.status_code == 302, response.text[:500]
    cookies = _cookie_flags(response)
    assert "jupyterhub-hub-login" in cookies, cookies
    form_cookies = {cookie.name: cookie for cookie in browser.cookies}
    for name, flags in cookies.items():
        assert {"secure", "httponly"} <= flags, (name, flags)
    assert form_cookies["_xsrf"].secure and form_cookies["_xsrf"].has_nonstandard_attr("HttpOnly")
    admin, _ = log_in(url, ADMIN, passwords[ADMIN], cert)
    assert admin.status_code == 302

    # A name that failed too often waits, even with its right password, and is told so.
    failed = [_post_login(browser, url, "grace", secrets.token_urlsafe(12)).status_code for _ in range(6)]
    assert failed == [403] * 5 + [429], failed  # the stranger's try above was the first of 5 free ones
    locked = _post_login(browser, url, "grace", passwords["grace"])
    assert locked.status_code == 429 and "Too many failed logins: wait" in locked.text, locked.status_code

    # 50 wrong logins at once: the hub's API answers about as fast as when idle. Probes run from 4
    # threads all along; only those sent while the flood lasts count.
    probes = [_login_form(url, cert) for _ in range(4)]
    deadline = time.perf_counter() + 2
    idle = statistics.median(seconds for _, seconds in _probe(probes, url, lambda: time.perf_counter() < deadline))
    browsers = [_login_form(url, cert) for _ in range(FLOOD)]
    start, flood_over = threading.Barrier(FLOOD + 1), threading.Event()

    def guess(number: int) -> int:
        start.wait()
        return _post_login(browsers[number], url, f"guess{number}", secrets.token_urlsafe(12)).status_code

    with ThreadPoolExecutor(FLOOD + 1) as pool:
        guesses = [pool.submit(guess, number) for number in range(FLOOD)]
        measured = pool.submit(_probe, probes, url, lambda: not flood_over.is_set())
        start.wait()
        started = time.perf_counter()
        codes = [each.result() for each in guesses]
        ended = time.perf_counter()
        flood_over.set()
        during = [seconds for sent, seconds in measured.result() if started <= sent < ended]
    busy = statistics.median(during)
    print(f"/hub/api/ median: idle {idle * 1000:.1f} ms, during {FLOOD} wrong logins {busy * 1000:.1f} ms "
          f"({busy / idle:.1f}x, {len(during)} probes); the flood took {ended - started:.1f} s; "
          f"answers {sorted((code, codes.count(code)) for code in set(codes))}")
    assert 302 not in codes and set(codes) <= {403, 429}, codes
    assert codes.count(403) >= 10, codes  # the flood did make the hub hash passwords
    assert len(during) >= 4, during
    assert busy <= 5 * idle, f"median {busy * 1000:.1f} ms during the flood, {idle * 1000:.1f} ms idle"

    # The flood locked this address out. A guesser who writes another address in the headers
    # Tornado reads (X-Real-Ip, X-Forwarded-For) is still this address, and still refused.
    for number, headers in enumerate([{"X-Real-Ip": "203.0.113.7"}, {"X-Forwarded-For": "198.51.100.9"},
                                      {"X-Real-Ip": "203.0.113.8", "X-Forwarded-For": "198.51.100.10"}]):
        spoofer = _login_form(url, cert, headers)
        refused = _post_login(spoofer, url, f"spoofer{number}", secrets.token_urlsafe(12))
        assert refused.status_code == 429, (headers, refused.status_code, refused.text[-1500:])


def test_a_login_counts_under_the_address_the_proxy_appended():
    from hub_logins import client_address

    through_our_proxy = {"X-Forwarded-For": "203.0.113.7, 192.0.2.10"}  # a client's own entry, then the proxy's
    assert client_address(through_our_proxy, "127.0.0.1") == "192.0.2.10"
    assert client_address({}, "127.0.0.1") == "127.0.0.1"  # no proxy: the connection's own peer
    behind_https_proxy = {"X-Forwarded-For": "203.0.113.7, 192.0.2.10, 127.0.0.1"}
    assert client_address(behind_https_proxy, "127.0.0.1", proxies_in_front=1) == "192.0.2.10"
    assert client_address({"X-Forwarded-For": "127.0.0.1"}, "127.0.0.1", proxies_in_front=1) == "127.0.0.1"


def test_one_door_https_outside_loopback_inside(hub):
    """Every port the hub opens: HTTPS only, or on 127.0.0.1 only."""
    ports = _listening(hub["process"])
    public = [(address, port) for address, port in ports if not ipaddress.ip_address(address).is_loopback]
    inside = [(address, port) for address, port in ports if ipaddress.ip_address(address).is_loopback]
    print("listening:", ports)
    assert public and inside, ports  # the proxy's public port; the hub's API and the proxy's API
    assert len(inside) >= 2, ports
    for address, port in public:
        assert not _plain_http_answers(port), f"plain HTTP answered on {address}:{port}"
    import requests

    response = requests.get(f"https://127.0.0.1:{public[0][1]}/hub/api/", verify=hub["cert"], timeout=30)
    assert response.status_code == 200


def test_each_name_gets_a_password_once_and_a_new_one_when_its_entry_is_removed(tmp_path):
    """docs/instructors.md, "Hand out the logins": a name added later gets one at the next start; a
    name whose entry was removed from passwords.json (and logins.txt) gets a new one."""
    import json

    from hub_logins import LOGINS, PASSWORDS, hand_out_logins, handed_out, password_matches, stored_hashes

    assert hand_out_logins(tmp_path, {"ada", "grace"}) == ["ada", "grace"]
    first = handed_out(tmp_path)
    assert hand_out_logins(tmp_path, {"ada", "grace", "linus"}) == ["linus"]  # the next start: only the new name
    assert {name: first[name] for name in ("ada", "grace")} == {n: handed_out(tmp_path)[n] for n in ("ada", "grace")}
    hashes = stored_hashes(tmp_path)
    assert all(password_matches(hashes[name], password) for name, password in handed_out(tmp_path).items())
    assert first["ada"] not in (tmp_path / PASSWORDS).read_text()  # only hashes are kept there

    del hashes["ada"]  # the instructor removes ada's entry and her line
    (tmp_path / PASSWORDS).write_text(json.dumps(hashes))
    logins = tmp_path / LOGINS
    logins.write_text("".join(line + "\n" for line in logins.read_text().splitlines() if not line.startswith("ada ")))
    assert hand_out_logins(tmp_path, {"ada", "grace", "linus"}) == ["ada"]
    again = handed_out(tmp_path)["ada"]
    assert again != first["ada"] and password_matches(stored_hashes(tmp_path)["ada"], again)
    assert not password_matches(stored_hashes(tmp_path)["ada"], first["ada"])
    for name in (PASSWORDS, LOGINS):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
