"""The parent's side of a running launch: read each rank's frames until every rank has returned,
one fails, or a time limit passes.

Introduced in chapter 00 (preflight). ``_Waiter`` runs the loop and leans on small pieces:
``_Inbox`` (the ranks' frames, here), ``_Clock`` (the time limits, here), failures.py (which rank
to blame), measuring.py (a judged launch's measurements) and live.py (the progress shown meanwhile).

Timeouts
--------
``timeout`` is the time ``fn`` may run, counted from the moment every rank has entered it;
starting the ranks (interpreters, imports, rendezvous) is bounded separately by
``startup_timeout``. So a hang demo can use a 3-second timeout on every start method. Neither
counts the time the ranks were ready to run but waited for a CPU (Linux: /proc/PID/schedstat),
up to ``_MAX_STRETCH`` times the timeout: on a server shared by a class, where each rank gets a
fraction of a core, a launch is slow but does not time out, while a hang (ranks asleep in a
collective, or spinning with a core to themselves) is reported as soon as on an idle machine.
Launches run by the grader (course_lib.grading) keep the plain rule: a grading run bounds each
cell by wall time and sets its own number of jobs.
"""

from __future__ import annotations

import contextlib
import signal
import time
from multiprocessing.connection import wait as wait_for_any

import cloudpickle

from ..confine.out_of_memory import describe_limit, oom_kills
from .errors import MemoryLimitExceeded, UnsendableResult, WorkerError
from .failures import _gather_failure
from .measuring import _MEMORY_SAMPLE_SECONDS, _Meter
from .protocol import (_RESULT_BASELINE, _RESULT_ERROR, _RESULT_STARTED, _RESULT_UNSENDABLE, _load_data,
                       _read_header, too_large)
from .reports import WorkerTimeout, _collect_stacks, _format_traceback

# A timeout stretches (by the ranks' wait for a CPU) to at most this many times itself.
_MAX_STRETCH = 10


class _Waiter:
    """Collects each rank's messages until all have returned, one fails, or time runs out."""

    def __init__(self, procs, result_conns, paths, live_view, judged=None, drains=(), loopback_before=None):
        self.procs, self.paths, self.live_view = procs, paths, live_view
        self.judged = judged is not None
        self.sandbox = judged.sandbox if judged is not None else None
        self.world_size = len(procs)
        self.meter = _Meter(procs, paths, judged, drains, loopback_before)
        self.inbox = _Inbox(procs, result_conns, self.meter, judged)
        self.measurements = [None] * self.world_size  # judged: each rank's, once all have returned

    def wait(self, timeout, startup_timeout):
        clock = _Clock(self.procs, timeout, startup_timeout, wall_time_only=self.judged)
        poll = _MEMORY_SAMPLE_SECONDS if self.judged else 0.1
        while self.inbox.pending:
            if self.judged:
                self._watch_the_sandbox()
            try:
                for ready in wait_for_any(self.inbox.watched(), timeout=poll):
                    self.inbox.handle(ready)
            except WorkerError as first:
                raise _gather_failure(self.inbox, first) from None
            clock.tick(every_rank_entered=len(self.inbox.entered) == self.world_size)
            if not self.inbox.pending:
                break
            self._stop_if_past(clock)
            self.live_view.update(clock.launched, self.paths["out"], self.paths["progress"])
        if self.judged:
            self.measurements = self.meter.measure_all()
        return self.inbox.results

    def _watch_the_sandbox(self):
        self.meter.sample_memory()
        if self.sandbox is not None and self.sandbox.ended_because:
            raise WorkerError(min(self.inbox.pending), "SandboxLimit", f"the submission's sandbox was ended: "
                              f"{self.sandbox.ended_because}", "", self.world_size)
        over = self.meter.over_memory_limit()
        if over is not None:  # stopped now: how long the rest would take must not decide what is reported
            raise MemoryLimitExceeded(*over, self.meter.memory_limit, self.world_size)

    def _stop_if_past(self, clock):
        """Past a time limit: every unfinished rank's stack, in a WorkerTimeout."""
        phase = clock.past_limit()
        if phase is None:
            return
        pending = self.inbox.pending
        stacks = _collect_stacks(self.procs, pending, self.paths["stack"], read_sources=not self.judged)
        if phase == "fn":
            raise WorkerTimeout(clock.timeout, stacks, set(range(self.world_size)) - pending,
                                self.world_size, waited_s=clock.waited)
        raise WorkerTimeout(clock.startup_timeout, stacks, set(self.inbox.entered), self.world_size,
                            phase="startup", waited_s=clock.waited)


class _Clock:
    """A launch's two time limits (start-up, then fn), neither counting the ranks' wait for a CPU."""

    def __init__(self, procs, timeout, startup_timeout, wall_time_only):
        self.procs, self.timeout, self.startup_timeout = procs, timeout, startup_timeout
        self.wall_time_only = wall_time_only  # grading: the grader's own per-cell time limit is wall time
        self.launched = self.now = time.monotonic()
        self.fn_started = self.fn_waits = None
        self.waited = 0.0

    def tick(self, every_rank_entered: bool) -> None:
        """The time now; fn's limit starts when every rank has entered fn."""
        self.now = time.monotonic()
        if self.fn_started is None and every_rank_entered:
            self.fn_started, self.fn_waits = self.now, self._cpu_waits()

    def past_limit(self) -> str | None:
        """"fn" or "startup" when that limit has passed (at the last tick), else None."""
        if self.fn_started is not None:
            return "fn" if self._past(self.now - self.fn_started, self.timeout, self.fn_waits) else None
        waits_before = [0.0] * len(self.procs)
        return "startup" if self._past(self.now - self.launched, self.startup_timeout, waits_before) else None

    def _cpu_waits(self) -> list[float]:
        return [_cpu_wait_s(proc.pid) for proc in self.procs]

    def _past(self, elapsed, limit, waits_before) -> bool:
        """Has more than ``limit`` passed, not counting the longest any rank waited for a CPU?"""
        if elapsed <= limit:
            return False  # /proc is read only once the plain deadline has passed
        if self.wall_time_only:
            return True   # grading: keep the plain rule
        waited = max(now - before for now, before in zip(self._cpu_waits(), waits_before))
        self.waited = min(max(waited, 0.0), (_MAX_STRETCH - 1) * limit)
        return elapsed - self.waited > limit


def _cpu_wait_s(pid) -> float:
    """Seconds the process (its main thread) was ready to run but waited for a CPU (Linux), or 0."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class _Inbox:
    """Each rank's frames as they arrive: who has entered fn, what each returned, who failed or died."""

    def __init__(self, procs, result_conns, meter, judged=None):
        self.procs, self.conns, self.meter = procs, result_conns, meter
        self.judged = judged is not None
        self.max_result_bytes = judged.max_result_bytes if judged is not None else None
        self.world_size = len(procs)
        self.results = [None] * self.world_size
        self.pending = set(range(self.world_size))
        self.entered = set()  # ranks that have entered fn
        self.conn_rank = {id(conn): rank for rank, conn in enumerate(result_conns)}
        self.sentinel_rank = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        self.oom_kills_before = oom_kills()  # to tell a rank the OOM killer ended from one killed otherwise

    def watched(self) -> list:
        """What to wait on: each pending rank's result pipe and its process's exit."""
        return [self.conns[r] for r in self.pending] + [self.procs[r].sentinel for r in self.pending]

    def handle(self, ready):
        """Take what ``ready`` (a rank's pipe, or its process's exit) says; a failed rank's WorkerError is raised."""
        rank = self.sentinel_rank[ready] if isinstance(ready, int) else self.conn_rank[id(ready)]
        if rank not in self.pending:
            return
        if isinstance(ready, int):  # the process exited
            if self.conns[rank].poll():
                return  # a message (or end-of-pipe) is waiting: the pipe branch reads it
            raise self._died(rank)
        try:
            message = _read_header(self.conns[rank], rank, self.world_size, rank in self.meter.baselines)
        except EOFError:  # the pipe closed with nothing in it: the process died
            raise self._died(rank) from None
        kind = message[0]
        if kind == _RESULT_BASELINE:
            self.meter.note_baseline(rank, message[1], message[2])
        elif kind == _RESULT_STARTED:
            self.entered.add(rank)
        elif kind in (_RESULT_ERROR, _RESULT_UNSENDABLE):
            error_class = UnsendableResult if kind == _RESULT_UNSENDABLE else WorkerError
            _, exc_type, text, frames = message
            remote_tb = _format_traceback(rank, frames, read_sources=not self.judged) if frames else ""
            raise error_class(rank, str(exc_type), str(text), remote_tb, self.world_size)
        else:
            self._take_result(rank)

    def _take_result(self, rank):
        try:
            payload = self.conns[rank].recv_bytes(self.max_result_bytes)
        except OSError:  # longer than max_result_bytes: the pipe is not read further
            raise WorkerError(rank, "ResultTooLarge", too_large(self.max_result_bytes), "", self.world_size) from None
        self.entered.add(rank)
        if self.judged:
            self.meter.payload_bytes[rank] = len(payload)
            self.results[rank] = _load_data(payload, rank, self.world_size, self.max_result_bytes)
        else:
            self.results[rank] = cloudpickle.loads(payload)
        self.pending.discard(rank)

    def _died(self, rank) -> WorkerError:
        proc = self.procs[rank]
        proc.join(1)
        reason = f"the worker process {_describe_exit(proc.exitcode)} before returning"
        if proc.exitcode in (-signal.SIGKILL, _FORKSERVER_LOST) and _rose(self.oom_kills_before, oom_kills()):
            whom = ("this rank (it was killed by SIGKILL)" if proc.exitcode == -signal.SIGKILL else
                    "the launch server that started this rank, so its exit status was lost")
            reason = (f"out of memory: {describe_limit()}, and the kernel's out-of-memory killer ended {whom}. Use "
                      "less memory per rank or fewer ranks, or shut down the kernels of notebooks you are not using "
                      "(each holds memory, with its launch server)")
        return WorkerError(rank, "ProcessDied", reason, "", self.world_size)


# multiprocessing's forkserver reports this exit code for a rank whose status it could not read, which happens
# when the forkserver (the launch server) was itself killed: out of memory, its killer may end the server in turn.
_FORKSERVER_LOST = 255


def _rose(before: int | None, now: int | None) -> bool:
    return before is not None and now is not None and now > before


def _describe_exit(code) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
