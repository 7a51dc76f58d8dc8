"""course_lib.traces and course_lib.debugging (chapter 10) on real traces and a real process."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from course_lib.debugging import py_spy_dump, py_spy_path, wait_for_file
from course_lib.traces import load_events, merge_traces, trace_spans


@pytest.fixture(scope="module")
def two_traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    paths = []
    for rank in range(2):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("forward"):
                torch.ones(64, 64) @ torch.ones(64, 64)
        paths.append(folder / f"rank{rank}.json")
        prof.export_chrome_trace(str(paths[-1]))
    return paths


def test_load_events_returns_complete_events_in_time_order(two_traces):
    events = load_events(two_traces[0])
    assert events and all(e["ph"] == "X" and "dur" in e for e in events)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    assert any(e["name"] == "forward" for e in events)


def test_merge_gives_each_rank_its_own_process(two_traces, tmp_path):
    merged = merge_traces(two_traces, tmp_path / "merged.json")
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    assert json.loads((tmp_path / "merged.json").read_text()) == merged


def test_trace_spans_start_at_zero_and_keep_only_what_is_asked(two_traces):
    spans = trace_spans([load_events(p) for p in two_traces], compute=("forward",))
    assert [len(s) for s in spans] == [1, 1]
    assert min(start for rank_spans in spans for _, _, start, _ in rank_spans) == 0.0
    assert all(kind == "forward" and end >= start for rank_spans in spans for kind, _, start, end in rank_spans)


def test_trace_spans_marks_gloo_events_as_communication():
    events = [[{"name": "gloo:all_reduce", "ts": 10.0, "dur": 5.0}, {"name": "c10d::allreduce_", "ts": 9.0, "dur": 1.0},
               {"name": "aten::mm", "ts": 20.0, "dur": 1.0}]]
    assert trace_spans(events) == [[("comm", "gloo:all_reduce", 0.0, 5e-6)]]


def test_py_spy_dump_explains_instead_of_raising_for_a_missing_process():
    ok, text = py_spy_dump(2 ** 22 + 12345)  # above the default pid_max: no such process
    assert ok is False and text


@pytest.mark.skipif(py_spy_path() is None, reason="py-spy not installed")
def test_py_spy_dump_reads_a_live_python_process(tmp_path):
    script = "import time\ndef waiting_here():\n    time.sleep(30)\nwaiting_here()\n"
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        time.sleep(1.0)
        ok, text = py_spy_dump(proc.pid)
        if not ok:  # no permission to trace here: the explanation must say how to fix it
            assert "ptrace" in text or "sudo" in text or "permission" in text.lower()
        else:
            assert "waiting_here" in text
    finally:
        proc.kill()
        proc.wait()


def test_wait_for_file(tmp_path):
    target = tmp_path / "pid"
    assert wait_for_file(target, timeout=0.2) is None
    target.write_text(str(os.getpid()))
    assert wait_for_file(target, timeout=1) == str(os.getpid())
