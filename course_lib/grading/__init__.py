"""Grading that cannot be forged: the checks, the judge and the learner side, together.

Introduced with chapter 01's exercises. ``checks`` tells a learner what is wrong (``checking``,
``expect``...); ``judge`` runs a learner's answer cells only in fresh worker processes and
takes back data only (``Learner``); ``verdicts`` is the pytest plugin through which
``scripts/grade.py`` hears each check's outcome on a pipe no learner process holds. The
names below are imported on first use, so that plugin's process never imports torch.
"""

import importlib

_WHERE = {
    **dict.fromkeys(["CheckFailed", "checking", "expect", "expect_close", "expect_equal", "run_until_clean"],
                    ".checks"),
    **dict.fromkeys(["Learner", "AnswerRef", "hidden_seed", "in_grading"], ".judge"),
}
__all__ = list(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
