"""The class hub's logins (jupyter/jupyterhub_config.py): a password for every roster name and for
the instructor, made before the hub opens and handed out by the instructor. Nobody picks a name
and claims it; a name without a password made here cannot log in at all.

* ``hand_out_logins`` makes a password for each name that has none yet, keeps only its salted
  scrypt hash (HUB_STATE/passwords.json) and writes the password itself to HUB_STATE/logins.txt,
  one ``NAME PASSWORD`` a line, for the instructor to hand out. Both files are root's, mode 600.
* ``RosterAuthenticator`` checks a login against those hashes. The hashing runs in a thread (it
  takes tens of milliseconds, and hashlib lets go of the GIL), so the hub keeps answering while
  many logins are checked. Tries are counted per name and per address (``LoginBackoff``): after
  a few free ones, each further try locks the name (or the address) out, for 5 s, then 10, 20, ...
  up to 5 minutes, and a try while locked out is refused at once, without hashing. A good login
  forgives its own try.
* The address a try is counted under is the one the hub's proxy took the connection from
  (``client_address``), never one the client wrote in a header.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jupyterhub.auth import Authenticator
from tornado import web
from traitlets import Integer, Unicode

PASSWORDS, LOGINS = "passwords.json", "logins.txt"
# scrypt's cost: about 16 MiB and 50-100 ms a hash on a laptop core (RFC 7914's interactive setting).
SCRYPT = {"n": 2**14, "r": 8, "p": 1}


# --------------------------------------------------------------------------
# Passwords: made here, kept as salted hashes
# --------------------------------------------------------------------------
def hash_password(password: str, salt: bytes | None = None, n: int = SCRYPT["n"], r: int = SCRYPT["r"],
                  p: int = SCRYPT["p"]) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 2**20, dklen=32)
    return f"scrypt${n}${r}${p}${salt.hex()}${digest.hex()}"


def password_matches(stored: str, password: str) -> bool:
    _, n, r, p, salt, digest = stored.split("$")
    again = hash_password(password, bytes.fromhex(salt), int(n), int(r), int(p))
    return hmac.compare_digest(again.encode(), stored.encode())  # (same time whatever matches)


def _write_private(path: Path, text: str) -> None:
    """Write a file only root may read: made with mode 600, never readable in between."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def stored_hashes(state: Path) -> dict[str, str]:
    path = state / PASSWORDS
    return json.loads(path.read_text()) if path.exists() else {}


def hand_out_logins(state: Path, names) -> list[str]:
    """A new password for each of ``names`` that has none: its hash into passwords.json, the
    password into logins.txt (appended). The names that got one."""
    hashes = stored_hashes(state)
    new = {name: secrets.token_urlsafe(12) for name in sorted(names) if name not in hashes}
    if new:
        hashes.update({name: hash_password(password) for name, password in new.items()})
        _write_private(state / PASSWORDS, json.dumps(hashes, indent=1, sort_keys=True))
        logins = state / LOGINS
        before = logins.read_text() if logins.exists() else ""
        _write_private(logins, before + "".join(f"{name} {password}\n" for name, password in new.items()))
    return sorted(new)


def handed_out(state: Path) -> dict[str, str]:
    """logins.txt as {name: password} (what the instructor hands out)."""
    path = state / LOGINS
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(line.split(" ", 1) for line in lines if line.strip())


# --------------------------------------------------------------------------
# Failed logins: a growing wait, per name and per address
# --------------------------------------------------------------------------
class LoginBackoff:
    """Counts login tries per key (a name, an address), before they are checked, so a burst of
    tries at once is counted too. The first ``free`` cost nothing; each further one locks the key
    for 5, 10, 20, ... s (at most ``longest_s``), and a try while it is locked is refused. A key's
    count is forgotten ``forget_s`` after its last try; a good login forgives its own try."""

    def __init__(self, free: int, first_wait_s: float = 5, longest_s: float = 300, forget_s: float = 900,
                 clock=time.monotonic):
        self.free, self.first_wait_s, self.longest_s, self.forget_s = free, first_wait_s, longest_s, forget_s
        self.clock = clock
        self._tries: dict[str, tuple[int, float]] = {}  # key -> (tries, time of the last)
        self._locked_until: dict[str, float] = {}

    def try_now(self, key: str) -> float:
        """0 when ``key`` may try now (the try is counted), else how many seconds it must still wait."""
        now = self.clock()
        wait_s = self._locked_until.get(key, 0.0) - now
        if wait_s > 0:
            return wait_s
        count, last = self._tries.get(key, (0, now))
        count = 1 if now - last > self.forget_s else count + 1
        self._tries[key] = (count, now)
        if count > self.free:
            self._locked_until[key] = now + min(self.longest_s, self.first_wait_s * 2 ** (count - self.free - 1))
        return 0.0

    def forgive(self, key: str) -> None:
        """A good login: its try does not count."""
        count, last = self._tries.get(key, (1, 0.0))
        if count <= 1:
            self._tries.pop(key, None)
            self._locked_until.pop(key, None)
        else:
            self._tries[key] = (count - 1, last)


# --------------------------------------------------------------------------
# Who is trying: the address the proxy saw
# --------------------------------------------------------------------------
def client_address(headers, direct: str, proxies_in_front: int = 0) -> str:
    """The address a login came from, as a proxy of the hub's own saw it.

    JupyterHub serves behind its proxy (configurable-http-proxy), which appends the address it took
    the connection from to X-Forwarded-For; an HTTPS reverse proxy in front of it (HUB_IP=127.0.0.1)
    appends its client's the same way, one entry further left. Those entries are the only ones a
    client cannot write. Tornado's ``remote_ip`` cannot be used: with the X-headers JupyterHub turns
    on, it is the client's own X-Real-Ip when there is one, any address the client likes, which
    would let a guesser start each try as a new address (or lock a whole class's address out).
    ``direct``: the connection's own peer, for a request that came through no proxy."""
    entries = [entry.strip() for entry in headers.get("X-Forwarded-For", "").split(",") if entry.strip()]
    kept_by_us = 1 + proxies_in_front  # the entries our own proxies appended, at the right end
    if len(entries) >= kept_by_us:
        return entries[-kept_by_us]
    return direct


# --------------------------------------------------------------------------
# The authenticator
# --------------------------------------------------------------------------
class RosterAuthenticator(Authenticator):
    """Logins with the passwords ``hand_out_logins`` made (HUB_STATE/passwords.json), nothing else."""

    state = Unicode(config=True, help="The hub's state folder, which holds passwords.json (root only)")
    free_failures_per_name = Integer(5, config=True, help="Failed logins for one name before it waits")
    free_failures_per_address = Integer(
        30, config=True, help="Failed logins from one address before it waits (a class may share one)")
    hashing_threads = Integer(1, config=True, help="Logins checked at once (each takes a core for ~0.1 s)")
    proxies_in_front = Integer(0, config=True, help="HTTPS reverse proxies in front of the hub's own proxy, "
                               "each appending its client's address to X-Forwarded-For (HUB_IP=127.0.0.1: 1)")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._by_name = LoginBackoff(self.free_failures_per_name)
        self._by_address = LoginBackoff(self.free_failures_per_address)
        self._hashing = ThreadPoolExecutor(self.hashing_threads, thread_name_prefix="login-hash")
        self._unknown = hash_password(secrets.token_urlsafe(12))  # checked for unknown names: same time

    async def authenticate(self, handler, data):
        name = self.normalize_username(str(data.get("username", "")))
        password = str(data.get("password", ""))
        address = "local" if handler is None else client_address(
            handler.request.headers, getattr(handler.request.connection.context, "_orig_remote_ip", "direct"),
            self.proxies_in_front)
        wait_s = self._by_address.try_now(address) or self._by_name.try_now(name)
        if wait_s > 0:  # refused before any hashing: a flood of guesses costs the hub nothing
            self.log.warning("Login for %r from %s refused: locked out for %.0f s more", name[:32], address, wait_s)
            raise web.HTTPError(429, f"Too many failed logins: wait {wait_s:.0f} s, then try again "
                                     "with the password your instructor gave you")
        stored = stored_hashes(Path(self.state)).get(name, self._unknown)
        loop = asyncio.get_running_loop()
        good = await loop.run_in_executor(self._hashing, password_matches, stored, password)
        if good and stored is not self._unknown:
            self._by_name.forgive(name)
            self._by_address.forgive(address)
            return name
        self.log.warning("Failed login for %r from %s", name[:32], address)
        return None
