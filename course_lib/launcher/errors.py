"""The errors a notebook sees when a launch fails, and which of the failing ranks they blame.

Introduced in chapter 00 (preflight), where a rank that raises stops the launch at once; chapter
10 (debugging) reads them closely. A hang's error, ``WorkerTimeout``, is in reports.py.
"""

from __future__ import annotations

import re


class LaunchError(RuntimeError):
    """A launch did not finish: the message says which rank and why."""


class WorkerError(LaunchError):
    """One rank raised (or died). ``rank``, ``exc_type`` and ``remote_traceback`` say how."""

    def __init__(self, rank, exc_type, message, remote_traceback, world_size, also_failed=()):
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.world_size = world_size
        self.also_failed = list(also_failed)  # other ranks' failures seen with this one (WorkerErrors)
        others = world_size - 1 - len(self.also_failed)
        stopped = f"\nThe other {others} rank{'s were' if others != 1 else ' was'} stopped." if others else ""
        super().__init__(self._report(stopped))

    def _report(self, the_rest: str) -> str:
        also = "".join(f"\nRank {other.rank} failed too, with {other.exc_type}: {_first_line(other.message)}"
                       for other in self.also_failed)
        return (f"rank {self.rank} failed with {self.exc_type}: {self.message}\n"
                f"{self.remote_traceback.rstrip()}{also}{the_rest}")

    def with_every_rank(self, finished, also_failed=()) -> "WorkerError":
        """The report with a line for every other rank: the error it raised too, that it had
        finished (returned its result), or that it was stopped."""
        self.also_failed = sorted([*self.also_failed, *also_failed], key=lambda other: other.rank)
        failed = {self.rank} | {other.rank for other in self.also_failed}
        lines = [f"\nRank {rank} had finished." if rank in finished else f"\nRank {rank} was stopped."
                 for rank in range(self.world_size) if rank not in failed]
        left = sorted(set(finished) - failed)
        if left and "connectFullMesh" in self.message and _lost_a_peer(self):
            # gloo blames "a remote worker crashing"; here a peer had returned, having left the group
            lines.append(f"\nRank(s) {', '.join(map(str, left))} had finished while rank {self.rank} was still "
                         "connecting to the group: a rank that calls destroy_process_group right after "
                         "init_process_group, with no collective in between, closes connections its peers are "
                         "still setting up. Call dist.barrier() before dist.destroy_process_group().")
        self.args = (self._report("".join(lines)),)
        return self


def _first_line(text: str) -> str:
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


# What gloo and the store raise on a rank whose peer went away: that rank is a victim, not the cause.
_LOST_PEER = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|remote worker", re.IGNORECASE)


def _lost_a_peer(error: WorkerError) -> bool:
    return error.exc_type != "ProcessDied" and bool(_LOST_PEER.search(error.message))


class UnsendableResult(WorkerError, TypeError):
    """A rank's return value could not be pickled back to the notebook."""


class MemoryLimitExceeded(WorkerError):
    """A judged launch stopped because a rank's memory grew past the check's limit (see
    course_lib.grading.Learner.launch): ``grown_bytes``, what it had grown by when every rank was
    stopped, read from outside it; ``limit_bytes``, the limit."""

    def __init__(self, rank, grown_bytes, limit_bytes, world_size):
        self.grown_bytes, self.limit_bytes = grown_bytes, limit_bytes
        super().__init__(rank, "MemoryLimitExceeded", f"its memory grew by {grown_bytes} bytes, past the check's "
                         f"limit of {limit_bytes}, and every rank was stopped there", "", world_size)


class MeasurementRefused(LaunchError):
    """A judged launch whose measurements show bytes that did not go where the rules count them."""
