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


def test_expect_count_accepts_one_result_per_case_and_nothing_else():
    # The count is the check's own: a list the learner side emptied, padded or replaced fails, and says why.
    from course_lib.grading import CheckFailed, expect_count

    expect_count([1, 2, 3], 3, "three cases")
    expect_count({"a": 1, "b": 2}, 2, "two parts", unit="part")
    for wrong, said in [([], "compared 0 of 3 cases: results came back for 0 of them"),
                        ([1, 2], "results came back for 2 of them"), ([1, 2, 3, 4], "results came back for 4"),
                        (None, "a NoneType came back instead of one result per case"),
                        (iter([1, 2, 3]), "a list_iterator came back")]:
        with pytest.raises(CheckFailed, match="changed the check's own data") as failed:
            expect_count(wrong, 3, "three cases")
        assert said in str(failed.value), failed.value
    with pytest.raises(CheckFailed, match="compared 0 of 1 pass:"):
        expect_count([], 1, "one pass", unit="pass")
