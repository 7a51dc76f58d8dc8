"""course_lib.fault_tolerance (chapter 14): the formulas, the clock of a run with failures, the checksum."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from course_lib.fault_tolerance import (bits_checksum, checkpoint_files, expected_goodput, failure_clock_steps,
                                        flip_bit, lost_fraction, mtbf_hours, run_with_failures,
                                        young_daly_interval)


def test_mtbf_from_a_failure_count():
    cluster, device = mtbf_hours(interruptions=419, days=54, devices=16_384)
    assert cluster == pytest.approx(54 * 24 / 419)
    assert device == pytest.approx(cluster * 16_384)


def test_young_daly_interval_minimises_the_first_order_loss():
    delta, mtbf = 3.0, 200.0
    best = young_daly_interval(delta, mtbf)
    assert best == pytest.approx(math.sqrt(2 * delta * mtbf))
    assert lost_fraction(best, delta, mtbf) == pytest.approx(math.sqrt(2 * delta / mtbf))
    for other in (0.8 * best, 1.25 * best):
        assert lost_fraction(other, delta, mtbf) > lost_fraction(best, delta, mtbf)


def test_expected_goodput_without_failures_is_the_checkpoint_share_and_tends_to_first_order():
    assert expected_goodput(10, 2, mtbf=1e8) == pytest.approx(10 / 12, rel=1e-5)
    # For delta << T << M the exact expectation and the first-order formula agree.
    assert expected_goodput(100, 1, mtbf=1e6) == pytest.approx(1 - lost_fraction(100, 1, 1e6), abs=2e-4)


def test_failure_steps_are_seeded_and_at_the_right_rate():
    assert failure_clock_steps(50, 1000, seed=3) == failure_clock_steps(50, 1000, seed=3)
    assert failure_clock_steps(50, 1000, seed=3) != failure_clock_steps(50, 1000, seed=4)
    assert len(failure_clock_steps(50, 100_000, seed=0)) == pytest.approx(2000, rel=0.1)


def test_the_clock_without_failures_counts_steps_and_checkpoints():
    run = run_with_failures(total_steps=20, interval=5, delta=2, failures=[])
    assert run == {"clock": 20 + 3 * 2, "executed": 20, "failures": 0, "restarts": []}  # no checkpoint after the last


def test_a_failure_loses_the_work_since_the_last_checkpoint():
    # Steps 1-5 at clock 1-5, checkpoint at clock 6-7, steps 6-7 at clock 8-9; clock 10 fails at step 8.
    run = run_with_failures(total_steps=10, interval=5, delta=2, failures=[10])
    assert run["restarts"] == [5]
    assert run["executed"] == 10 + 2                    # steps 6 and 7 are done twice
    assert run["clock"] == 10 + 5                       # the failed step, then steps 6-10 (no checkpoint after the last)
    # A failure while writing loses that checkpoint as well.
    during = run_with_failures(total_steps=10, interval=5, delta=2, failures=[7])
    assert during["restarts"] == [0] and during["executed"] == 15 and during["clock"] == 7 + 10 + 2


def test_the_clock_model_follows_the_expected_goodput():
    means = statistics.mean(60 / run_with_failures(60, 6, 1, failure_clock_steps(40, 2000, seed))["clock"]
                            for seed in range(200))
    assert means == pytest.approx(expected_goodput(6, 1, 40), abs=0.03)


def test_one_flipped_bit_changes_the_checksum_even_when_the_float_sum_does_not():
    torch.manual_seed(0)
    params = [torch.randn(64, dtype=torch.float64), torch.randn(8, dtype=torch.float64)]
    before, float_before = bits_checksum(params), sum(p.sum() for p in params).item()
    flip_bit(params[0], index=3, bit=0)
    assert bits_checksum(params) != before
    flip_bit(params[0], index=3, bit=0)
    assert bits_checksum(params) == before
    flip_bit(params[1], index=0, bit=63)                # the sign bit
    assert bits_checksum(params) != before
    assert isinstance(float_before, float)
    with pytest.raises(TypeError):
        bits_checksum([torch.zeros(2)])


def test_checkpoint_files_lists_names_and_sizes(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"123")
    (tmp_path / "y").write_bytes(b"")
    assert checkpoint_files(tmp_path) == [("a/x.bin", 3), ("y", 0)]


# --- torchft replica groups (course_lib.fault_tolerance.run_replica_groups) ----------------------------

def _ft_train(replica_id, lighthouse, steps, report):
    """A tiny torchft replica group, as in chapter 14 (defined here so that the test needs no notebook)."""
    from datetime import timedelta

    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=5)), min_replica_size=1,
                      state_dict=lambda: {"model": model.state_dict()},
                      load_state_dict=lambda s: model.load_state_dict(s["model"]),
                      replica_id=f"replica_{replica_id}", lighthouse_addr=lighthouse, hostname="127.0.0.1",
                      store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
                      use_async_quorum=False, init_sync=False, timeout=timedelta(seconds=5),
                      quorum_timeout=timedelta(seconds=30))
    report("ready")
    while manager.current_step() < steps:
        manager.start_quorum()
        if replica_id == 1 and steps == 3 and manager.current_step() == 1:
            raise ValueError("replica 1 fails on purpose")
        g = torch.Generator().manual_seed(manager.current_step() * 10 + replica_id)
        optimizer.zero_grad()
        model(torch.randn(8, 4, dtype=torch.float64, generator=g)).pow(2).mean().backward()
        for p in model.parameters():
            manager.allreduce(p.grad).wait()
        committed = manager.should_commit()
        if committed:
            optimizer.step()
        report({"step": manager.current_step(), "trained": manager.current_step() - committed,
                "committed": committed, "params": model.weight.detach().clone()})
    manager.shutdown(wait=False)


def _torchft_processes(since: float) -> list[str]:
    """Processes started since ``since`` that loaded torchft's native module, or name torchft or a lighthouse."""
    import psutil

    found = []
    for process in psutil.process_iter(["pid", "create_time", "cmdline"]):
        try:
            if process.info["create_time"] < since - 1:
                continue
            cmdline = " ".join(process.info["cmdline"] or [])
            with open(f"/proc/{process.pid}/maps") as f:
                mapped = "_torchft" in f.read()
        except (psutil.Error, OSError):
            continue
        if mapped or "torchft" in cmdline or "lighthouse" in cmdline:
            found.append(f"{process.pid} {cmdline[:120]}")
    return found


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def torchft_run():
    pytest.importorskip("torchft")
    psutil = pytest.importorskip("psutil")
    import time

    from course_lib import launch

    launch(int, 1, init_process_group=False, show_output=False)  # the launch server, started once, stays
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    listening_before = {c.laddr for c in me.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    started = time.time()
    yield
    deadline = time.monotonic() + 5  # SIGKILLed processes are reaped at once; give the kernel a moment
    while time.monotonic() < deadline:
        left = ({p.pid for p in me.children(recursive=True)} - children_before, _torchft_processes(started))
        if not any(left):
            break
        time.sleep(0.1)
    assert left == (set(), []), f"left behind: {left}"
    assert {c.laddr for c in me.net_connections("inet") if c.status == psutil.CONN_LISTEN} <= listening_before


def test_a_torchft_run_with_a_replica_killed_leaves_nothing_behind(torchft_run):
    from course_lib.fault_tolerance import run_replica_groups, sort_stderr

    # Back only when the others have committed 11 of 12 steps: they wait for it at their last step.
    groups, lighthouse = run_replica_groups(_ft_train, 3, 12, kill={"replica": 2, "at_step": 3, "down_steps": 8},
                                            timeout=90)
    assert [[p["ended"] for p in processes] for processes in groups] == [["finished"], ["finished"],
                                                                        ["killed", "finished"]]
    assert [r["trained"] for r in groups[0][0]["records"] if r["committed"]] == list(range(12))
    assert max(r["trained"] for r in groups[2][0]["records"] if r["committed"]) == 2
    assert [r["trained"] for r in groups[2][1]["records"]] == [11]  # healed to step 11, then trained it
    assert torch.equal(groups[2][1]["records"][-1]["params"], groups[0][0]["records"][-1]["params"])
    assert all(sort_stderr(p["stderr"])[2] == [] for processes in groups for p in processes)
    assert lighthouse["quorum_changes"] >= 3  # all three, two, all three again
    assert not _listening(int(lighthouse["address"].rsplit(":", 1)[1]))


def test_a_torchft_run_that_fails_leaves_nothing_behind(torchft_run):
    from course_lib import WorkerError
    from course_lib.fault_tolerance import run_replica_groups

    with pytest.raises(WorkerError, match="replica 1 fails on purpose"):
        run_replica_groups(_ft_train, 3, 3, timeout=60)


def test_stderr_is_sorted_into_known_lines_torchft_reports_and_the_rest():
    from course_lib.fault_tolerance import sort_stderr

    text = ("[W1206 02:15:35.5 Backend.hpp:619] Warning: setSequenceNumberForGroup() is deprecated and ...\n"
            '::ffff:127.0.0.1 - - [06/Dec/2026 02:15:35] "GET /checkpoint/0/full HTTP/1.1" 200 -\n'
            "[replica_0:abc/0 - step 8] got exception waiting for work: Connection reset by peer\n"
            "Traceback (most recent call last):\n"
            '  File "manager.py", line 1327, in wait\n'
            "RuntimeError: Connection reset by peer\n"
            "something else\n")
    counts, reports, others = sort_stderr(text)
    assert sorted(n for n in counts.values() if n) == [1, 1]
    assert reports == ["[replica_0:abc/0 - step 8] got exception waiting for work: Connection reset by peer"]
    assert others == ["something else"]


def test_without_torchft_the_section_gets_a_reason(monkeypatch):
    import sys

    from course_lib.fault_tolerance import torchft_available

    monkeypatch.setitem(sys.modules, "torchft", None)  # as on a platform with no wheel
    ok, why = torchft_available()
    assert not ok and "Linux x86_64 only" in why and "make setup" in why


def _write_the_same_mark(folder, times):
    from course_lib.fault_tolerance import _mark

    for _ in range(times):
        _mark(folder, "finished")


def test_slots_that_end_together_can_all_write_the_finished_mark(tmp_path):
    """Two slots ending at once can both see every slot done and both write "finished": once, in CI,
    the second's rename found the first's temporary file already renamed (FileNotFoundError), and
    the lesson's torchft cell failed. Four processes here write the same mark 300 times each."""
    import multiprocessing as mp

    writers = [mp.get_context("fork").Process(target=_write_the_same_mark, args=(str(tmp_path), 300))
               for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["finished"]  # no temporary file left behind
