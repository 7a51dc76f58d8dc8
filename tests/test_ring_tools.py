"""Tests of chapter 05's helpers: bandwidth arithmetic, the α–β fit, the ring pictures' labels
and the benchmark script (run small)."""

import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.bandwidth import BUSBW_FACTOR, SIZES_1K_TO_64M, bus_bandwidth, calls_for, fit_alpha_beta
from course_lib.ring_plots import contributors

REPO = Path(__file__).resolve().parents[1]


def test_bus_bandwidth_uses_nccl_tests_factors():
    assert bus_bandwidth(1e9, 1.0, "all_reduce", 4) == pytest.approx(1.5e9)
    assert bus_bandwidth(1e9, 1.0, "all_gather", 4) == pytest.approx(0.75e9)
    assert bus_bandwidth(1e9, 2.0, "broadcast", 8) == pytest.approx(0.5e9)
    assert set(BUSBW_FACTOR) >= {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"}


def test_the_fit_recovers_a_known_latency_and_bandwidth():
    alpha, beta = 50e-6, 1 / 2e9
    seconds = [alpha + beta * s for s in SIZES_1K_TO_64M]
    fitted_alpha, fitted_beta = fit_alpha_beta(SIZES_1K_TO_64M, seconds)
    assert fitted_alpha == pytest.approx(alpha, rel=1e-6)
    assert fitted_beta == pytest.approx(beta, rel=1e-6)


def test_the_weighted_fit_keeps_the_latency_of_small_messages():
    # 10% noise on the largest size would swamp an unweighted fit's intercept; the weighted one holds
    alpha, beta = 50e-6, 1 / 2e9
    seconds = [alpha + beta * s for s in SIZES_1K_TO_64M]
    seconds[-1] *= 1.1
    fitted_alpha, _ = fit_alpha_beta(SIZES_1K_TO_64M, seconds)
    assert fitted_alpha == pytest.approx(alpha, rel=0.2)


def test_calls_for_small_and_large_sizes():
    assert calls_for(1024) == 40 and calls_for(64 * 2**20) == 3


def test_contributors_decode_the_bit_masks():
    assert contributors(0b1011) == [0, 1, 3]
    assert contributors(1) == [0] and contributors(0) == []


def test_bench_ring_runs_and_reports_the_target():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_ring.py"), "--sizes-mb", "1",
                          "--world-sizes", "2", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "memcpy bandwidth" in run.stdout
    assert "    2    1 MB" in run.stdout                       # one row: 2 ranks, 1 MB
    assert "target not measured (needs 16 MB on 2 ranks)" in run.stdout


def test_bench_ring_refuses_too_many_ranks():
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_ring.py"), "--world-sizes", "8"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 2 and "--world-sizes" in run.stderr
