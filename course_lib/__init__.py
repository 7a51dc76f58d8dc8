"""course_lib: the small library the course's notebooks share.

Each object says which chapter introduced it; the teaching itself lives in the notebooks.

The names below are imported on first use (``from course_lib import launch`` imports the
launcher, and with it torch): a process that needs only a light part, such as the grader's
pytest plugin ``course_lib.grading.verdicts``, does not pay for importing torch.
"""

from ._lazy import lazy_names

_WHERE = {
    **dict.fromkeys(["launch", "LaunchError", "WorkerError", "WorkerTimeout", "rank_device", "report_progress"],
                    ".launcher"),
    "StatusLine": ".launcher.live",
    **dict.fromkeys(["CheckFailed", "checking", "expect", "expect_close", "expect_count", "expect_equal",
                     "run_until_clean"], ".grading.checks"),
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_names(__name__, _WHERE)
