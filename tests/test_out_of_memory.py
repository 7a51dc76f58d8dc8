"""Out of memory in a learner's server: a rank dies, not the notebook's kernel, and the learner is told why.

A stand-in for a notebook's kernel runs in a memory cgroup of 1.5 GiB (the hub gives each learner one:
jupyter/hub_spawner.py), holds 0.8 GiB of tensors itself, and launches two ranks, one of which fills 1 GiB:
the kernel is then the biggest process of the group, which the kernel's OOM killer picks by default. It must
pick that rank (course_lib.confine.out_of_memory: ranks and the launch server ask to be picked first),
the launch must fail with "out of memory" and the limit, and the kernel must go on to its next line.
Needs root and a writable memory cgroup (CI has both); skipped elsewhere, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from optional import skip_or_fail

from course_lib.confine.cgroups import Cgroups, cgroup_roots
from course_lib.confine.out_of_memory import describe_limit, memory_limit, oom_kills

REPO = Path(__file__).resolve().parents[1]
LIMIT = 3 << 29  # 1.5 GiB

KERNEL = """
import torch
from course_lib import launch, LaunchError

learners_tensors = torch.ones(200 << 20)  # 0.8 GiB, every page touched: the biggest process is this one


def fills_memory(gib):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        held = torch.ones(gib << 28)  # float32: gib GiB, every page touched
        return float(held[-1])
    return 0.0


try:
    launch(fills_memory, world_size=2, args=(1,), timeout=120)
    print("LAUNCH RETURNED")
except LaunchError as exc:
    print("LAUNCH FAILED:", exc)
print("KERNEL STILL HERE", float(learners_tensors.sum()))
"""


def test_the_machines_count_of_oom_kills_is_read():
    assert isinstance(oom_kills(), int)  # Linux 4.13 and later; the message depends on it


def test_the_limit_is_described_as_the_learner_sees_it(monkeypatch):
    from course_lib.confine import out_of_memory

    monkeypatch.setattr(out_of_memory, "memory_limit", lambda: 2 << 30)
    assert describe_limit() == "this server's memory limit is 2.0 GiB, for the kernel and every rank together"
    monkeypatch.setattr(out_of_memory, "memory_limit", lambda: None)
    assert describe_limit() == "this machine ran out of memory"


def test_a_rank_out_of_memory_is_named_and_the_kernel_survives(tmp_path):
    roots = cgroup_roots() if os.geteuid() == 0 else None
    if roots is None:
        skip_or_fail("needs root and a writable memory cgroup, to hold the stand-in kernel to a limit",
                     "COURSE_REQUIRE_HUB", "the out-of-memory test")
    group = Cgroups(roots, f"course-oom-test-{uuid.uuid4().hex[:8]}", LIMIT, 4096)
    try:
        script = tmp_path / "kernel.py"
        script.write_text(KERNEL)
        env = dict(os.environ, PYTHONPATH=str(REPO), COURSE_CPUS="2")
        run = subprocess.run(["sh", "-c", group.join_command() + f"exec {sys.executable} {script}"],
                             capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    finally:
        group.remove()
    said = run.stdout + run.stderr
    assert run.returncode == 0 and "KERNEL STILL HERE" in run.stdout, said[-3000:]
    assert "LAUNCH FAILED" in run.stdout and "rank 1" in run.stdout, said[-3000:]
    assert "out of memory: this server's memory limit is 1.5 GiB" in run.stdout, said[-3000:]


def test_this_process_reads_its_own_limit_or_none():
    limit = memory_limit()
    assert limit is None or limit > 0


@pytest.mark.parametrize("exit_code, whom", [(-9, "ended this rank (it was killed by SIGKILL)"),
                                             (255, "ended the launch server that started this rank")])
def test_a_rank_or_its_launch_server_killed_out_of_memory_is_named(monkeypatch, exit_code, whom):
    """Out of memory, the killer may end the launch server (multiprocessing's forkserver) after or instead of
    the rank; the rank's status is then lost and reads 255. Seen once in CI beside the class's grading: the
    report said "exited with code 255", which blames nothing. With no OOM kill counted, the code is reported as is."""
    from types import SimpleNamespace

    from course_lib.launcher import wait

    rank = SimpleNamespace(join=lambda timeout: None, exitcode=exit_code)
    inbox = SimpleNamespace(procs={1: rank}, oom_kills_before=3, world_size=2)
    monkeypatch.setattr(wait, "describe_limit", lambda: "this server's memory limit is 1.5 GiB")
    monkeypatch.setattr(wait, "oom_kills", lambda: 4)
    assert f"out of memory: this server's memory limit is 1.5 GiB, and the kernel's out-of-memory killer {whom}" \
        in str(wait._Inbox._died(inbox, 1))
    monkeypatch.setattr(wait, "oom_kills", lambda: 3)
    assert "out of memory" not in str(wait._Inbox._died(inbox, 1))
