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
        launcher.measuring._Meter.sample_memory = lambda self, everything=False: None
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


LIMIT_SCRIPT = textwrap.dedent("""
    from course_lib.grading import Learner
    from course_lib.launcher import MemoryLimitExceeded

    def hold(megabytes, seconds):
        import time, torch
        block = torch.ones(megabytes * 2**20 // 4)  # touched: resident
        time.sleep(seconds)
        return block.numel()

    learner = Learner(answers=(), setup="import torch")
    for megabytes, seconds in (([0, 300], 500), ([0, 30], 0.5)):  # each rank's, against a limit of 100 MB
        try:
            learner.launch(hold, 2, rank_args=[(mb, seconds) for mb in megabytes], init_process_group=False,
                           timeout=600, memory_limit=100 << 20)
            print("finished")
        except MemoryLimitExceeded as stopped:
            print("stopped", stopped.rank, stopped.grown_bytes, stopped.limit_bytes)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memory is measured on Linux only")
def test_a_rank_past_the_memory_limit_stops_the_launch_at_once():
    run = subprocess.run([sys.executable, "-c", LIMIT_SCRIPT], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    stopped, under = run.stdout.strip().splitlines()[-2:]
    # Rank 1 holds 300 MB for 500 s against a limit of 100 MB: stopped long before (this test's own limit
    # is 240 s), whatever the machine's load, and blamed; rank 0 holds nothing.
    assert stopped.split()[:2] == ["stopped", "1"], run.stdout
    assert int(stopped.split()[2]) > 100 << 20 and int(stopped.split()[3]) == 100 << 20
    # Under the limit, the same launch runs to its end.
    assert under == "finished", run.stdout


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
    # Nor must rank 0's own client talking to the TCPStore it hosts (0.9 to 3.5 KB, growing with
    # how long rank 0 waits for rank 1): it reaches no other rank.
    env = dict(os.environ, COURSE_START_METHOD=start_method)
    run = subprocess.run([sys.executable, "-c", BYTES_SCRIPT], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    rank0, rank1 = map(int, run.stdout.split()[-2:])
    assert 65536 * 4 <= rank0 <= 65536 * 4 + 4096  # the tensor, and the rendezvous
    assert rank1 <= 1024


FLOWS_SCRIPT = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from course_lib.confine import tcp_flows
    from course_lib.grading import Learner

    def pass_to_the_next(numbers):
        # Rank r sends (r + 1) * numbers floats to rank r + 1 (the last to rank 0), and nothing else.
        import torch
        rank, world = dist.get_rank(), dist.get_world_size()
        outgoing = torch.ones((rank + 1) * numbers)
        incoming = torch.empty(((rank - 1) % world + 1) * numbers)
        send = dist.isend(outgoing, (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        send.wait()
        return 0

    if sys.argv[1] == "refused":  # as in a container whose seccomp profile forbids netlink sockets
        def refused(*args, **kwargs):
            raise PermissionError(1, "Operation not permitted")
        tcp_flows.diag_socket = refused
    learner = Learner(answers=(), setup="import torch")
    measured = learner.launch(pass_to_the_next, 3, args=(16384,), measure=True)[1]
    print(*[m["sent_to"] for m in measured], sep="\\n")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bytes between ranks are read on Linux only")
def test_the_bytes_between_ranks_are_counted_per_pair_from_outside():
    run = subprocess.run([sys.executable, "-c", FLOWS_SCRIPT, "counted"], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    sent = [eval(line) for line in run.stdout.strip().splitlines()[-3:]]  # noqa: S307 (lists of ints we printed)
    tensor = 16384 * 4
    for rank in range(3):
        for peer in range(3):
            expected = (rank + 1) * tensor if peer == (rank + 1) % 3 else 0
            if peer != rank:  # the rendezvous (rank 0 holds the store) adds a few KB, no more
                assert expected <= sent[rank][peer] <= expected + 4096, (rank, peer, sent)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bytes between ranks are read on Linux only")
def test_a_learner_whose_machine_refuses_the_socket_table_gets_no_counts_not_an_error():
    run = subprocess.run([sys.executable, "-c", FLOWS_SCRIPT, "refused"], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip().splitlines()[-3:] == ["None"] * 3


def test_a_result_of_millions_of_small_objects_is_refused_before_the_judge_loads_it():
    # Ten million empty lists are 60 MB of pickle that torch.load turned into 1.5 GiB of the judge's memory
    # over minutes. The judge counts a result's plain objects in its pickle first, without loading it.
    import io
    import time

    import torch

    from course_lib.launcher.errors import UnsendableResult
    from course_lib.launcher.protocol import _load_data

    def load(value):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return _load_data(buffer.getvalue(), 0, 2, 256 << 20)

    honest = {"loss": [0.5] * 10_000, "weights": torch.zeros(1 << 20), "name": "x" * 100_000}
    assert load(honest)["name"] == honest["name"]
    for hostile, why in [([[] for _ in range(600_000)], "more than 1,000,000 numbers, strings and containers"),
                         (list(range(2_000_000)), "MiB, more than the 8 MiB a check accepts")]:
        started = time.monotonic()
        with pytest.raises(UnsendableResult, match="ResultTooLarge") as refused:
            load(hostile)
        assert why in str(refused.value) and time.monotonic() - started < 10
