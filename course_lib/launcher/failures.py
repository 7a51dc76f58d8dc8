"""When a rank fails, which one to blame: the first error to arrive is often a victim's.

Part of chapter 00's launcher (preflight); chapter 10 (debugging) kills one rank and checks that
the report names it. When a rank dies, its peers' sockets close at once and gloo raises
"Connection closed by peer" on them; that error can reach the parent before the death does. So
after such an error the parent watches the other ranks up to ``_FAILURE_GRACE_S`` longer and
blames the rank that died or raised an error of its own, listing the others and saying which
ranks had finished. When the cause is a rank's own error, a peer's lost connection is not listed,
whether it came in before or after that error (which is chance): the report is the same every time.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait as wait_for_any

from .errors import WorkerError, _lost_a_peer

# After a rank reports a lost connection, how long to watch the other ranks for the cause.
_FAILURE_GRACE_S = 1.0


def _gather_failure(inbox, first: WorkerError) -> WorkerError:
    """The error to raise for a launch in which ``first`` arrived first: the cause, with every rank's fate."""
    error = _with_the_others(inbox, first)
    inbox.pending.discard(error.rank)
    late, stopped = _what_is_waiting(inbox), set()
    if not _lost_a_peer(error):
        # The cause showed itself; a peer that lost its connection to it is its consequence, and whether
        # that error came in before the peer was stopped is timing: the report says it was stopped.
        stopped = {other.rank for other in late if _lost_a_peer(other)}
        late = [other for other in late if other.rank not in stopped]
        if error.exc_type != "ProcessDied":
            # Likewise when a peer's lost connection came in even before the cause's own error (a rank
            # that raised exits at once, and its peers may report first): the same report either way.
            victims = {other.rank for other in error.also_failed if _lost_a_peer(other)}
            error.also_failed = [other for other in error.also_failed if other.rank not in victims]
            stopped |= victims
    failed = {error.rank} | {other.rank for other in [*error.also_failed, *late]}
    finished = set(range(inbox.world_size)) - inbox.pending - failed - stopped
    return error.with_every_rank(finished, late)


def _with_the_others(inbox, first: WorkerError) -> WorkerError:
    """A rank that lost a connection is usually not the cause: watch the others a moment longer
    (up to _FAILURE_GRACE_S) and blame the cause (see _root_cause)."""
    if not _lost_a_peer(first):
        return first  # a rank that died or raised an error of its own is the cause: report it as it is
    failures = [first]
    inbox.pending.discard(first.rank)
    deadline = time.monotonic() + _FAILURE_GRACE_S
    while inbox.pending:
        for ready in wait_for_any(inbox.watched(), timeout=max(0.0, deadline - time.monotonic())):
            try:
                inbox.handle(ready)
            except WorkerError as error:
                failures.append(error)
                inbox.pending.discard(error.rank)
        if time.monotonic() >= deadline or not all(_lost_a_peer(f) for f in failures):
            break  # time is up, or the cause has shown itself
    return _root_cause(failures, inbox.world_size)


def _what_is_waiting(inbox) -> list[WorkerError]:
    """Read what the other ranks sent before the failure was reported (a result that came in at
    the same moment is a rank that finished); the errors among it."""
    errors = []
    for rank in sorted(inbox.pending):
        while rank in inbox.pending and inbox.conns[rank].poll():
            try:
                inbox.handle(inbox.conns[rank])
            except WorkerError as error:
                errors.append(error)
                inbox.pending.discard(rank)
            except (EOFError, OSError):
                break
    return errors


def _root_cause(failures: list[WorkerError], world_size: int) -> WorkerError:
    """Of the ranks that failed together, the one to blame: a rank that died, else one whose error
    is not a lost connection, else the first. The others are listed with it."""
    died = [f for f in failures if f.exc_type == "ProcessDied"]
    own = [f for f in failures if not _lost_a_peer(f)]
    cause = (died or own or failures)[0]
    if len(failures) == 1:
        return cause
    rest = sorted((f for f in failures if f is not cause), key=lambda f: f.rank)
    return type(cause)(cause.rank, cause.exc_type, cause.message, cause.remote_traceback, world_size,
                       also_failed=rest)
