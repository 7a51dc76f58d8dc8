"""Kept so ``from course_lib.checks import ...`` still works: the checks live in course_lib.grading.checks."""

from .grading.checks import CheckFailed, checking, expect, expect_close, expect_equal  # noqa: F401

__all__ = ["CheckFailed", "checking", "expect", "expect_close", "expect_equal"]
