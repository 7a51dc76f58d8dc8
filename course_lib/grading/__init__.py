"""Grading that cannot be forged: the checks, the judge and the learner side, together.

Introduced with chapter 01's exercises. ``checks`` tells a learner what is wrong (``checking``,
``expect``...); ``judge`` runs a learner's answer cells only in fresh worker processes and
takes back data only (``Learner``); ``verdicts`` is the pytest plugin through which
``scripts/grade.py`` hears each check's outcome on a pipe no learner process holds. The
names below are imported on first use, so that plugin's process never imports torch.
"""

from .._lazy import lazy_names

_WHERE = {
    **dict.fromkeys(["CheckFailed", "checking", "expect", "expect_close", "expect_equal", "run_until_clean"],
                    ".checks"),
    **dict.fromkeys(["Learner", "AnswerRef", "hidden_seed", "in_grading"], ".judge"),
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_names(__name__, _WHERE)
