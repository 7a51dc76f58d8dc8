"""course_lib.grading.checks.run_until_clean: a timing-dependent case is run again, not judged blurred."""

import pytest

from course_lib.grading.checks import run_until_clean


def test_returns_the_first_clean_run_and_runs_no_more():
    runs = iter([3, 7, 1, 9])
    calls = []

    def run():
        calls.append(1)
        return next(runs)

    assert run_until_clean(run, lambda value: None if value < 2 else f"{value} is too slow") == 1
    assert len(calls) == 3


def test_gives_up_after_the_tries_and_says_what_was_blurred():
    calls = []

    def run():
        calls.append(1)
        return len(calls)

    with pytest.raises(RuntimeError, match=r"in 4 runs the machine was too busy .*\(run 4 was blurred\)"):
        run_until_clean(run, lambda value: f"run {value} was blurred", tries=4)
    assert len(calls) == 4
