"""Where `make test` spends its time: every test's and every notebook cell's duration.

With COURSE_DURATIONS_FILE set (the Makefile sets it), each pytest run appends one JSON line
per test (setup + call + teardown, in seconds) and one for the run as a whole, labelled with
COURSE_TEST_STAGE; scripts/test_durations.py turns the file into the table `make test` prints.
"""

from __future__ import annotations

import json
import os
import time

_durations: dict[str, float] = {}
_outcomes: dict[str, str] = {}
_started = time.monotonic()


def _machine_busy_seconds() -> float | None:
    """CPU seconds every process on this machine has used since boot (Linux), to tell a run that
    kept the cores busy from one that waited: processes the run did not wait for (a kernel's
    workers, the browser) escape its own rusage but not this."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, stat.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


_machine_busy_at_start = _machine_busy_seconds()


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("COURSE_DURATIONS_FILE")
    if not path or hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes
        return
    stage = os.environ.get("COURSE_TEST_STAGE", "pytest")
    with open(path, "a", encoding="utf-8") as out:
        for nodeid, seconds in _durations.items():
            out.write(json.dumps({"stage": stage, "test": nodeid, "seconds": round(seconds, 2),
                                  "outcome": _outcomes.get(nodeid, "passed")}) + "\n")
        out.write(json.dumps({"stage": stage, "test": None, "seconds": round(time.monotonic() - _started, 2),
                              "cpu_seconds": round(_cpu_seconds(), 1),
                              "machine_cpu_seconds": _machine_busy_since_start(),
                              "outcome": "failed" if exitstatus else "passed"}) + "\n")


def _machine_busy_since_start() -> float | None:
    now = _machine_busy_seconds()
    return None if now is None or _machine_busy_at_start is None else round(now - _machine_busy_at_start, 1)


def _cpu_seconds() -> float:
    """CPU time of this run and of every process it started and waited for (kernels, workers, ...)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return 0.0
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)
