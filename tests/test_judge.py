"""The judge's measurements of learner-side ranks (course_lib.grading.judge, course_lib.launcher).

What a check learns from outside a rank must not be something the rank can change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Runs as a script, so the functions travel to the learner side by value, as a notebook's do.
PEAK_SCRIPT = textwrap.dedent("""
    import sys
    from course_lib import launcher
    from course_lib.grading import Learner

    def hold_then_hide(megabytes):
        import time, torch
        block = torch.ones(megabytes * 2**20 // 4)  # touched: resident
        time.sleep(0.3)
        del block  # a large block goes back to the OS at once
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the kernel's high-water mark (VmHWM) to what is resident now
        return 0

    if sys.argv[1] == "no-sampling":
        launcher._Waiter._sample_memory = lambda self: None
    learner = Learner(answers=(), setup="import torch")
    peaks = [learner.launch(hold_then_hide, 1, args=(mb,), measure=True, init_process_group=False)[1][0]["peak_rss_bytes"]
             for mb in (0, 200)]
    print(peaks[1] - peaks[0])
""")


def measured_growth(mode: str) -> int:
    run = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, mode], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    return int(run.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak memory is measured on Linux only")
def test_a_rank_cannot_hide_its_peak_memory_by_resetting_the_high_water_mark():
    assert measured_growth("sampled") >= 150 * 2**20
    # Without the judge's own samples the reset works: this is what the sampling is for.
    assert measured_growth("no-sampling") < 50 * 2**20


BYTES_SCRIPT = textwrap.dedent("""
    import torch.distributed as dist
    from course_lib.grading import Learner

    def send_once(numbers):
        import torch
        tensor = torch.ones(numbers)
        if dist.get_rank() == 0:
            dist.send(tensor, 1)
        else:
            dist.recv(tensor, 0)
        return 0

    learner = Learner(answers=(), setup="import torch")
    print(*[m["sent_bytes"] for m in learner.launch(send_once, 2, args=(65536,), measure=True)[1]])
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="bytes sent are counted on Linux only")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_bytes_sent_count_only_what_ran_after_the_learner_side_started(start_method):
    # A spawned interpreter writes ~47 KB before any learner code (its `ldconfig -p` child's
    # output counts as its own): that must not count as sent by the answer.
    env = dict(os.environ, COURSE_START_METHOD=start_method)
    run = subprocess.run([sys.executable, "-c", BYTES_SCRIPT], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    rank0, rank1 = map(int, run.stdout.split()[-2:])
    assert 65536 * 4 <= rank0 <= 65536 * 4 + 4096  # the tensor, and the rendezvous
    assert rank1 <= 1024
