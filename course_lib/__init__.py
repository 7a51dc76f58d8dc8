"""course_lib: the small library the course's notebooks share.

Each object says which chapter introduced it; the teaching itself lives in the notebooks.
"""

from .checks import CheckFailed, checking, expect, expect_close, expect_equal
from .launcher import LaunchError, WorkerError, WorkerTimeout, launch, rank_device, report_progress

__all__ = [
    "launch", "LaunchError", "WorkerError", "WorkerTimeout", "rank_device", "report_progress",
    "CheckFailed", "checking", "expect", "expect_close", "expect_equal",
]
