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
