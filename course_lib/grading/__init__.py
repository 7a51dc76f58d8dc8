"""Grading that cannot be forged: every part of it, in one package.

Introduced with chapter 01's exercises. ``checks`` tells a learner what is wrong (``checking``,
``expect``...); ``judge`` runs a learner's answer cells only in fresh worker processes and
takes back data only (``Learner``); ``sandbox`` confines each submission's workers (bubblewrap)
and measures them from outside; ``verdicts`` is the pytest plugin through which the grader hears
each check's outcome on a pipe no learner process holds; ``grader`` is the command line
(``course-grade``, ``scripts/grade.py``), whose steps are ``merging``, ``running``, ``scoring`` and
``reporting``; ``exercises`` derives exercises/ from solutions/; ``chapter01`` ... ``chapter08`` hold
what a chapter's exercise setup cell imports for its checks. The names below are imported on first
use, so the verdicts plugin's process never imports torch.
"""

from .._lazy import lazy_names

_WHERE = {
    **dict.fromkeys(["CheckFailed", "checking", "expect", "expect_close", "expect_count", "expect_equal",
                     "run_until_clean"], ".checks"),
    **dict.fromkeys(["Learner", "AnswerRef", "hidden_seed", "in_grading"], ".judge"),
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_names(__name__, _WHERE)
