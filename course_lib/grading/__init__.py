"""Grading that cannot be forged: the checks, the judge and the learner side, together.

Introduced with chapter 01's exercises. ``checks`` tells a learner what is wrong (``checking``,
``expect``...); ``judge`` runs a learner's answer cells only in fresh worker processes and
takes back data only (``Learner``); ``verdicts`` is the pytest plugin through which
``scripts/grade.py`` hears each check's outcome on a pipe no learner process holds.
"""

from .checks import CheckFailed, checking, expect, expect_close, expect_equal, run_until_clean
from .judge import AnswerRef, Learner, hidden_seed, in_grading

__all__ = ["CheckFailed", "checking", "expect", "expect_close", "expect_equal", "run_until_clean",
           "Learner", "AnswerRef", "hidden_seed", "in_grading"]
