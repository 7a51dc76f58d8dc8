"""A learner with many notebooks open fits in the class hub's default memory limit (docs/instructors.md,
"Memory"): eight Jupyter kernels in one memory cgroup of 4 GiB, no swap, as the hub holds a learner, each
importing torch as a lesson does, then all launching four ranks at once. Every launch must succeed and
the kernel's OOM killer must not strike. With a launch server per kernel the same eight need about twice
the memory (scripts/bench_launch_servers.py prints both); with the learner's one shared server they fit.
Needs root and a writable memory cgroup (CI has both); skipped elsewhere, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from optional import skip_or_fail

from course_lib.confine.cgroups import cgroup_roots

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)
def test_eight_notebooks_each_launching_four_ranks_fit_in_the_hubs_default_limit():
    if os.geteuid() != 0 or cgroup_roots() is None:
        skip_or_fail("needs root and a writable memory cgroup, to hold the kernels to the hub's limit",
                     "COURSE_REQUIRE_HUB", "the eight-notebook memory test")
    command = [sys.executable, "scripts/bench_launch_servers.py", "--notebooks", "8", "--ranks", "4",
               "--limit", "4G", "--only", "shared"]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=850)
    said = run.stdout + run.stderr[-3000:]
    print(run.stdout)
    assert run.returncode == 0, said
    assert "8 notebooks, 4 ranks each, launch server shared" in run.stdout, said
    assert "all launches succeeded, nothing killed" in run.stdout, said
