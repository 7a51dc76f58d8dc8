"""The tests that need something `make` does not install (a browser, the hub, a Slurm cluster).

Without it such a test is skipped with the reason; CI installs it and sets COURSE_REQUIRE_<NAME>=1,
which turns the skip into a failure, so a broken install cannot pass unnoticed.
"""

import os

import pytest


def skip_or_fail(reason: str | None, variable: str, what: str) -> None:
    """Skip (or, with ``variable`` set to 1, fail) when ``reason`` says what is missing."""
    if not reason:
        return
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what} must run here but cannot: {reason}")
    pytest.skip(reason)
