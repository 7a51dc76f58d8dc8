"""course_lib: the small library the course's notebooks share.

Each object says which chapter introduced it; the teaching itself lives in the notebooks.
"""

# The launcher first: in a notebook kernel it starts the launch server before torch is
# imported here, so the two imports overlap (see course_lib.launcher, "How workers start").
from .launcher import LaunchError, WorkerError, WorkerTimeout, launch, rank_device, report_progress
from .grading.checks import CheckFailed, checking, expect, expect_close, expect_equal, run_until_clean

__all__ = [
    "launch", "LaunchError", "WorkerError", "WorkerTimeout", "rank_device", "report_progress",
    "CheckFailed", "checking", "expect", "expect_close", "expect_equal", "run_until_clean",
]
