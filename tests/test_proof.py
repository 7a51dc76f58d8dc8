"""The one rule that gives a check its points (course_lib.grading.scoring.why_not_passed) and the
judge's sealed records it reads (course_lib.grading.proof, running.read_records): a pass is proven,
never presumed from an error that did not arrive."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from course_lib.grading import proof
from course_lib.grading.running import CellOutcome, RunResult, read_records
from course_lib.grading.scoring import NO_REPORT, describe_failure, why_not_passed

SECRET = "this run's secret"


def sealed(source: str, ename: str | None, evalue: str | None = None, secret: str = SECRET) -> dict:
    cell = proof.cell_key(source)
    return {"cell": cell, "ename": ename, "evalue": evalue, "seal": proof.seal(secret, cell, ename)}


def run_with(status: str, record: dict | None, replaced: bool = False) -> RunResult:
    return RunResult({0: CellOutcome(status)}, {} if record is None else {0: record},
                     {0: "it hung the judge"} if replaced else {})


@pytest.mark.parametrize("status, record, replaced, why", [
    ("passed", {"ename": None}, False, None),                       # the only way to the points
    ("passed", None, False, "no record"),                           # nbval saw no error; the judge said nothing
    ("passed", {"ename": "ValueError"}, False, "an error"),         # an error that never reached nbval
    ("failed", {"ename": None}, False, "not passed"),
    ("missing", {"ename": None}, False, "not passed"),              # a run stopped for time mid-cell
    ("skipped", None, False, "not passed"),
    ("passed", {"ename": None}, True, "replaced"),                  # the cell that ran was the grader's raise
])
def test_a_cell_passes_only_when_nbval_and_the_judges_record_both_say_so(status, record, replaced, why):
    assert why_not_passed(run_with(status, record, replaced), 0) == why


def test_a_pass_that_never_reported_back_says_so():
    message = describe_failure(0, run_with("passed", None), 60, set())
    assert message == NO_REPORT and "did not report back" in message


def test_an_error_in_the_record_is_quoted_even_when_nbval_saw_none():
    message = describe_failure(0, run_with("passed", {"ename": "ValueError", "evalue": "rank 0 raised \\ud800"}), 60,
                               set())
    assert message == "ValueError: rank 0 raised \\ud800"


def test_records_count_only_with_the_judges_seal(tmp_path):
    sources = ["setup()", "check_one()", "check_two()", "check_three()"]
    forged = sealed(sources[2], None, secret="a guess")  # the right shape, another key
    unsealed = {"cell": proof.cell_key(sources[3]), "ename": None, "evalue": None}
    tampered = dict(sealed(sources[1], "CheckFailed", "wrong"), ename=None)  # the error taken out after sealing
    lines = [json.dumps(sealed(sources[0], None)), json.dumps(tampered), json.dumps(forged), json.dumps(unsealed),
             "{not json", json.dumps([1, 2]), "[" * 100_000, json.dumps(sealed("a cell not in this run", None))]
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(lines) + "\n")
    records = read_records(path, sources, SECRET)
    assert sorted(records) == [0]
    assert read_records(tmp_path / "absent.jsonl", sources, SECRET) == {}


def test_the_judge_records_each_cell_sealed_and_its_error_even_one_it_cannot_print(tmp_path):
    """A real kernel: record_cells' hook writes what the grader reads back, for a cell that ends cleanly,
    one whose error has a lone surrogate, and one whose exception's __str__ raises."""
    pytest.importorskip("ipykernel")
    from jupyter_client.manager import start_new_kernel

    seed, records = tmp_path / "seed", tmp_path / "records.jsonl"
    seed.write_text(SECRET)
    sources = [textwrap.dedent(f"""\
        import os
        os.environ["COURSE_GRADING_SEED_FILE"] = {str(seed)!r}
        import course_lib.grading.judge as judge
        judge.become_judge()
        judge.record_cells({str(records)!r})"""),
        "x = 1 + 1",
        'raise ValueError("\\ud800")',
        "class Unreadable(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\nraise Unreadable()"]
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        for source in sources:
            client.execute_interactive(source, timeout=60)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    got = read_records(records, sources, SECRET)
    assert sorted(got) == [0, 1, 2, 3]
    # IPython records the error it ended with: where showing the traceback failed too (it cannot encode the
    # message, or str() raises), that second error. Either way an error, which is all the score reads.
    assert [got[n]["ename"] for n in range(2)] == [None, None]
    assert got[2]["ename"] in ("ValueError", "UnicodeEncodeError") and got[3]["ename"] in ("Unreadable", "RuntimeError")
    assert not seed.exists()  # the judge read its secret and deleted the file
    assert read_records(records, sources, "another run's secret") == {}


def test_proof_module_needs_no_torch():
    # The grader's own process reads the records; it never imports torch for that.
    code = "import sys, course_lib.grading.proof, course_lib.grading.scoring; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
