"""pytest plugin: each nbval cell's outcome, written to a pipe only the grader holds.

``scripts/grade.py`` runs ``pytest -p course_lib.grading.verdicts`` with the pipe's write end as
file descriptor ``COURSE_VERDICT_FD``. The pytest process makes itself non-dumpable first, so no
other process of the user (a learner's worker included) can reach that descriptor through
/proc; the kernel nbval starts does not inherit it. The grader scores from these lines, not
from a file a learner's process could rewrite.
"""

from __future__ import annotations

import json
import os

from .dumpable import make_non_dumpable

_stream = None


def pytest_configure(config):
    global _stream
    make_non_dumpable()
    fd = os.environ.pop("COURSE_VERDICT_FD", None)
    if fd is not None:
        _stream = os.fdopen(int(fd), "w", buffering=1, encoding="utf-8")


def pytest_runtest_logreport(report):
    if _stream is None or not report.nodeid:
        return
    name = report.nodeid.rsplit("::", 1)[-1]
    message = ""
    if report.failed and report.longrepr is not None:
        message = str(getattr(report.longrepr, "reprcrash", None) or report.longrepr)[:2000]
    xfailed = hasattr(report, "wasxfail")
    _stream.write(json.dumps({"name": name, "when": report.when, "outcome": report.outcome,
                              "xfail": xfailed, "message": message}) + "\n")


def pytest_unconfigure(config):
    if _stream is not None:
        _stream.close()
