"""How the CPU is shared between submissions graded side by side (course_lib.confine.cgroups.cpu_sharing),
and the grader's answer where nothing shares it: one submission at a time.

The sandbox's side (setsid refused, torchrun's sessions made process groups, one autogroup and the CPU
cgroup holding every process) is attacked in tests/test_sandbox.py; scripts/bench_cpu_share.py measures a
neighbour's checks beside a hundred busy processes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from course_lib.confine import cgroups
from course_lib.grading import grader


@pytest.mark.parametrize("roots", [{"pids": Path("/p"), "memory": Path("/m"), "cpu": Path("/c")}])
def test_a_cpu_controller_gives_each_submission_a_cgroup(roots):
    assert cgroups.cpu_sharing(roots)[0] == "cgroup"


@pytest.mark.parametrize("on, in_root, expected", [(True, True, "session"), (True, False, None), (False, True, None),
                                                   (None, True, None)])
def test_without_a_cpu_cgroup_sessions_share_only_where_autogroups_hold(monkeypatch, on, in_root, expected):
    monkeypatch.setattr(cgroups, "_autogroups_on", lambda: on)
    monkeypatch.setattr(cgroups, "_in_cpu_root", lambda: in_root)
    how, why = cgroups.cpu_sharing({"pids": Path("/p"), "memory": Path("/m")})
    assert how == expected and why


@pytest.mark.parametrize("how, jobs, expected", [(None, 4, 1), ("session", 4, 4), ("cgroup", 4, 4), (None, 1, 1)])
def test_the_grader_grades_one_at_a_time_where_nothing_shares_the_cpu(monkeypatch, capsys, how, jobs, expected):
    monkeypatch.setattr(grader, "cpu_sharing", lambda roots: (how, "the reason it gives"))
    options = argparse.Namespace(jobs=jobs)
    grader.one_at_a_time_unless_cpu_is_shared(options)
    assert options.jobs == expected
    said = capsys.readouterr().out
    assert ("the reason it gives" in said and "one notebook at a time" in said) == (how is None and jobs > 1)
