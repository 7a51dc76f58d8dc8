"""Checks that tell the learner what is wrong, not just that something is.

Defined in chapter 00, used by every exercise's check cells::

    with checking("all_reduce built from send/recv"):
        got = launch(my_all_reduce, world_size=4)
        expect_close(got[0], torch.full((3,), 6.0), "rank 0's result",
                     hint="every rank should end with the sum over all ranks")

A passing check prints one line starting with a tick; a failing one raises
``CheckFailed``, which a notebook shows as a short explanation instead of a
traceback (IPython calls ``_render_traceback_``), and which still fails the cell
for nbval and for grading.

``run_until_clean`` (chapter 10) is for checks whose case depends on timing: it runs the case
again when a busy machine blurred it, instead of failing a correct notebook or answer.

``expect_count`` (chapter 02 on) is for checks that compare many cases at once: a check counts
what it compares, so that a learner side that sends back fewer results than the check has cases
fails instead of leaving cases uncompared::

    results = learner.call(split_by_speed_results, cases)
    expect_count(results, len(cases), "split_by_speed's results")
    for case, got in zip(cases, results, strict=True):
        ...
"""

from __future__ import annotations

import contextlib

import torch

from ..launcher import WorkerError, WorkerTimeout

__all__ = ["CheckFailed", "checking", "expect", "expect_close", "expect_count", "expect_equal", "run_until_clean"]


class CheckFailed(AssertionError):
    """A check did not pass; ``str()`` says what was checked, what went wrong and a hint."""

    def __init__(self, what: str, problem: str, hint: str | None = None):
        self.what, self.problem, self.hint = what, problem, hint
        text = f"FAILED {what}: {problem}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)

    def _render_traceback_(self):  # IPython: show the explanation, not a stack of frames
        return ["\u2718 " + str(self)]


def expect(condition: bool, what: str, problem: str, hint: str | None = None) -> None:
    """Fail with ``problem`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(what, problem, hint)


def expect_equal(actual, expected, what: str, hint: str | None = None) -> None:
    """Plain values (ints, strings, lists) must be equal."""
    if actual != expected:
        if _grading():  # the grader's cases are hidden: never quote their expected value
            raise CheckFailed(what, f"got {actual!r}, which is not the expected value", hint)
        raise CheckFailed(what, f"expected {expected!r}, got {actual!r}", hint)


def expect_count(results, count: int, what: str, unit: str = "case") -> None:
    """The learner side sent back one result for each of the check's ``count`` cases; else CheckFailed.

    A check that zips its cases with the results compares only as many cases as results came back.
    Code on the learner side can walk the stack up to the check's worker function (``sys._getframe``)
    and empty the list of cases it was sent there: nothing would be compared, and the check would
    pass. So ``count`` is the check's own number, fixed in the judge (a constant, or the length of a
    list the judge built, of which the learner side only ever got a copy), never the length of
    anything the learner side held or returned; and the loop that follows is ``zip(..., strict=True)``.
    ``unit``: what one case is called in the message ("pass", "step", ...).
    """
    held = len(results) if isinstance(results, (list, tuple, dict)) else None
    if held == count:
        return
    came_back = (f"results came back for {held} of them" if held is not None
                 else f"a {type(results).__name__} came back instead of one result per {unit}")
    raise CheckFailed(what, f"the check compared 0 of {count} {_plural(unit, count)}: {came_back}; your code "
                            "changed the check's own data (what it was sent, or what it sends back)",
                      hint="compute from your function's arguments only, and leave the data of the code that "
                           "calls it alone")


def _plural(noun: str, count: int) -> str:
    return noun if count == 1 else noun + ("es" if noun.endswith("s") else "s")


def _grading() -> bool:
    from .judge import in_grading

    return in_grading()


def _describe_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> str:
    diff = (actual.double() - expected.double()).abs()
    worst = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)) if diff.dim() else ()
    if _grading():  # the grader's cases are hidden: say where, never what the expected value is
        return f"{int((diff > 0).sum())} of {diff.numel()} elements differ (the largest difference at index {list(index)})"
    return (
        f"{int((diff > 0).sum())} of {diff.numel()} elements differ; the largest difference is "
        f"{diff.max().item():.3g} at index {list(index)} (got {actual.flatten()[worst].item():.6g}, "
        f"expected {expected.flatten()[worst].item():.6g})"
    )


def expect_close(actual, expected, what: str, hint: str | None = None, rtol=None, atol=None) -> None:
    """Tensors must match in type, shape and value (``torch.testing.assert_close`` tolerances)."""
    if not isinstance(actual, torch.Tensor):
        raise CheckFailed(what, f"expected a tensor, got {type(actual).__name__}: {actual!r}", hint)
    expected = torch.as_tensor(expected)
    if actual.shape != expected.shape:
        raise CheckFailed(what, f"expected shape {tuple(expected.shape)}, got {tuple(actual.shape)}", hint)
    if actual.dtype != expected.dtype:
        raise CheckFailed(what, f"expected dtype {expected.dtype}, got {actual.dtype} "
                                f"(convert with .to({expected.dtype}) or create the tensor with dtype=...)", hint)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError:
        raise CheckFailed(what, _describe_mismatch(actual, expected), hint) from None


@contextlib.contextmanager
def checking(what: str):
    """Run a check: print a tick when it passes, turn any failure into an explanation."""
    try:
        yield
    except CheckFailed:
        raise
    except NotImplementedError:
        raise CheckFailed(what, "not implemented yet", "replace `raise NotImplementedError` with your code") from None
    except WorkerError as exc:
        if exc.exc_type == "NotImplementedError":
            raise CheckFailed(what, "not implemented yet", "replace `raise NotImplementedError` with your code") from None
        if exc.exc_type == "NameError" and "answer cell" in exc.message:
            raise CheckFailed(what, exc.message) from None
        # The grader's feedback gives the type and message; a notebook also shows where.
        hint = None if _grading() else "read the rank's traceback below\n" + exc.remote_traceback
        raise CheckFailed(what, f"rank {exc.rank} raised {exc.exc_type}: {exc.message}", hint) from None
    except WorkerTimeout as exc:
        raise CheckFailed(what, "the ranks did not finish in time (a deadlock?)", str(exc)) from None
    else:
        print(f"\u2714 {what}: passed")


def run_until_clean(run, blurred, tries: int = 5):
    """``run()``, again (``tries`` times at most) until ``blurred(result)`` finds nothing wrong; that result.

    ``blurred`` returns None when the run is the case the text promises (measured on the ranks'
    own clocks, say), else what a busy machine blurred, in words: a rank that loses its CPU for
    tens of milliseconds can make a fast rank look slow. After ``tries`` blurred runs it raises,
    saying so, rather than let a blurred case decide a check.
    """
    for _ in range(tries):
        result = run()
        problem = blurred(result)
        if problem is None:
            return result
    raise RuntimeError(f"in {tries} runs the machine was too busy to make the case the check needs "
                       f"({problem}); run the cell again when it is less busy")
