"""Where `make test` spends its time: every test's and every notebook cell's duration.

With COURSE_DURATIONS_FILE set (the Makefile sets it), each pytest run appends one JSON line
per test (setup + call + teardown, in seconds) and one for the run as a whole, labelled with
COURSE_TEST_STAGE; scripts/test_durations.py turns the file into the table `make test` prints.
Run as root on Linux with cgroup v1's cpuacct controller, each pytest process (each xdist worker)
moves into a cpuacct cgroup of its own, which every process it starts stays in (kernels, ranks,
the browser, sandboxes, daemons that detach): a test's line then also holds the CPU seconds all of
them used, however busy the machine was, which a test's wall time on a shared machine does not tell.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

_durations: dict[str, float] = {}
_outcomes: dict[str, str] = {}
_cpu_by_test: dict[str, float] = {}
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


_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _own_cpu_cgroup(config) -> Path | None:
    """The cpuacct.usage file of a cgroup this process has just moved into, or None where it cannot."""
    if not os.environ.get("COURSE_DURATIONS_FILE") or not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        return None  # an xdist controller runs no test; its workers, started after this, each move
    try:
        if ":/course-tests-" in Path("/proc/self/cgroup").read_text():
            return None  # a pytest a test started: its CPU is that test's, so it stays in the test's cgroup
    except OSError:
        return None
    for left in _CPUACCT.glob("course-tests-*"):  # an earlier run's, once its processes are gone
        if not Path("/proc", left.name.rpartition("-")[2]).exists():  # never a live worker's, even empty
            try:
                left.rmdir()
            except OSError:
                pass
    own = _CPUACCT / f"course-tests-{os.getpid()}"
    try:
        own.mkdir(exist_ok=True)
        (own / "cgroup.procs").write_text(str(os.getpid()))
        return own / "cpuacct.usage"
    except OSError:
        return None


_cpu_usage_file: Path | None = None
_cpu_counted = 0.0


def pytest_configure(config):
    global _cpu_usage_file
    _cpu_usage_file = _own_cpu_cgroup(config)


def pytest_unconfigure(config):
    if _cpu_usage_file is not None:  # back to the parent cgroup, and this one goes once empty (else the next run's)
        try:
            (_CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
            _cpu_usage_file.parent.rmdir()
        except OSError:
            pass


def _cpu_since_last_report() -> float | None:
    """CPU seconds this process and everything it started used since the last report or the test's
    start (a worker runs one test at a time, so each test's setup, call and teardown reports add up
    to its own, and the worker's collection is no test's)."""
    global _cpu_counted
    try:
        used = int(_cpu_usage_file.read_text()) / 1e9
    except (AttributeError, OSError, ValueError):
        return None
    since, _cpu_counted = used - _cpu_counted, used
    return since


def pytest_runtest_logstart(nodeid, location):
    _cpu_since_last_report()


@pytest.hookimpl(tryfirst=True)  # before pytest's own makes the report, which copies user_properties
def pytest_runtest_makereport(item, call):
    cpu = _cpu_since_last_report()
    if cpu is not None:
        item.user_properties.append(("cpu_seconds", cpu))


def pytest_runtest_logreport(report):
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown":  # it carries the setup's, the call's and its own
        cpu = [value for name, value in report.user_properties if name == "cpu_seconds"]
        if cpu:
            _cpu_by_test[report.nodeid] = sum(cpu)
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("COURSE_DURATIONS_FILE")
    if not path or hasattr(session.config, "workerinput"):  # an xdist worker: its controller writes
        return
    stage = os.environ.get("COURSE_TEST_STAGE", "pytest")
    with open(path, "a", encoding="utf-8") as out:
        for nodeid, seconds in _durations.items():
            line = {"stage": stage, "test": nodeid, "seconds": round(seconds, 2),
                    "outcome": _outcomes.get(nodeid, "passed")}
            if nodeid in _cpu_by_test:
                line["test_cpu_seconds"] = round(_cpu_by_test[nodeid], 2)
            out.write(json.dumps(line) + "\n")
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
