"""Proof of a pass: a cell counts only when the judge itself said that it ran to its end.

Introduced with chapter 01's exercises (the grader). nbval's verdict on a cell is what reached
pytest from the kernel: an error the kernel could not send (a message that cannot be encoded, a
kernel that stopped answering) reached nothing, and a cell with no error in sight "passed". So a
verdict alone proves nothing. After every cell, the judge writes one line on its own channel (the
run's record file, which no learner process can reach): which cell ran, and its error or none,
sealed with a key drawn from the grading run's secret, which only the judge and the grader hold.
A cell passes when nbval says so *and* that sealed line says it ended without an error
(``course_lib.grading.scoring.why_not_passed``); anything missing, unreadable or unsealed fails.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["cell_key", "seal", "is_sealed"]


def cell_key(source: str) -> str:
    """Which cell a record is about: the hash of the source the kernel ran (unique in a graded run)."""
    return hashlib.sha1(source.encode("utf-8", "replace")).hexdigest()


def _key(secret: str) -> bytes:
    # Its own derivation: the hidden cases' seeds come from the same secret (judge.hidden_seed).
    return hashlib.sha256(f"{secret}:the judge's records".encode()).digest()


def _message(cell: str, ename: str | None) -> bytes:
    return f"{cell}\0{ename or ''}".encode("utf-8", "backslashreplace")


def seal(secret: str, cell: str, ename: str | None) -> str:
    """The judge's seal on 'this cell ran, and ended with this error (None: none)'."""
    return hmac.new(_key(secret), _message(cell, ename), hashlib.sha256).hexdigest()


def is_sealed(secret: str, entry: dict) -> bool:
    """Whether a record line carries the judge's seal for what it says."""
    cell, ename, mark = entry.get("cell"), entry.get("ename"), entry.get("seal")
    if not isinstance(cell, str) or not isinstance(mark, str) or not (ename is None or isinstance(ename, str)):
        return False
    return hmac.compare_digest(seal(secret, cell, ename), mark)
