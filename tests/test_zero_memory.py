"""Tests of chapter 08's library code: course_lib.memory (bytes held, the calculator),
course_lib.sharding (the collective clock) and course_lib.deepspeed_cpu."""

import importlib.util
import os

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.memory import (draw_memory_bars, format_bytes, held_bytes, memory_calculator,
                               memory_table, optimizer_state_bytes)


def test_held_bytes_counts_each_storage_once():
    flat = torch.zeros(100)
    views = [flat[:40].view(4, 10), flat[40:]]
    assert held_bytes(views) == 400                      # two views, one storage
    assert held_bytes([flat, torch.zeros(10, dtype=torch.float64), None]) == 480
    assert held_bytes([]) == 0


def test_held_bytes_sees_a_freed_storage_as_empty():
    flat = torch.zeros(100)
    flat.untyped_storage().resize_(0)
    assert held_bytes([flat]) == 0


def test_optimizer_state_bytes_counts_per_element_state_only():
    params = [torch.nn.Parameter(torch.ones(10)), torch.nn.Parameter(torch.ones(3, 2))]
    adam = torch.optim.AdamW(params)
    assert optimizer_state_bytes(adam) == 0               # no state before the first step
    for p in params:
        p.grad = torch.ones_like(p)
    adam.step()
    assert optimizer_state_bytes(adam) == 2 * 4 * 16      # exp_avg + exp_avg_sq, the step counters left out
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    sgd.step()
    assert optimizer_state_bytes(sgd) == 4 * 16


def test_format_bytes_uses_decimal_units():
    assert format_bytes(120e9) == "120.0 GB"
    assert format_bytes(2.8e12) == "2.8 TB"
    assert format_bytes(512) == "512 B"


def _paper(psi, n, stage, k=12):
    return (4 + k) * psi / n if stage == 3 else {0: (4 + k) * psi, 1: 4 * psi + k * psi / n,
                                                 2: 2 * psi + (2 + k) * psi / n}[stage]


def test_memory_table_prints_the_formula_it_is_given(capsys):
    rows = memory_table(_paper, [(7.5e9, 64)])
    assert rows == [["7.5e+09", "64", "120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"]]
    assert "ZeRO-3" in capsys.readouterr().out


def test_the_calculator_and_the_bars_build_without_a_display():
    import matplotlib
    matplotlib.use("Agg")
    parts = lambda psi, n, stage, k: {"parameters": 2 * psi, "gradients": 2 * psi, "optimizer": k * psi / n}
    box = memory_calculator(_paper, parts)
    assert len(box.children) == 3
    ax = draw_memory_bars({"DDP": parts(1e9, 8, 0, 12)}, "test")
    assert len(ax.patches) == 3


def _clocked_collectives():
    from course_lib.sharding import CollectiveClock
    from course_lib.timeline import Timeline
    timeline = Timeline()
    t = torch.ones(8)
    with CollectiveClock(timeline) as clock:
        out = torch.empty(8 * dist.get_world_size())
        dist.all_gather_into_tensor(out, t)
        dist.reduce_scatter_tensor(torch.empty(8 // dist.get_world_size()), t)
        (t * 2).sum()                                   # not a collective: not recorded
    return clock.order, timeline.spans


def test_collective_clock_records_each_collective_in_order_with_a_span():
    results = launch(_clocked_collectives, world_size=2, timeout=60, show_output=False)
    for order, spans in results:
        assert order == ["all_gather_into_tensor", "reduce_scatter_tensor"]
        assert [s[0] for s in spans] == ["comm", "comm"]
        assert all(end >= start for _, _, start, end in spans)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_deepspeed_starts_on_cpu_without_building_its_shared_memory_op():
    os.environ["DS_ACCELERATOR"] = "cpu"

    def start():
        from course_lib.deepspeed_cpu import SHM_OP, start_deepspeed_on_cpu
        deepspeed = start_deepspeed_on_cpu()
        from deepspeed.comm import comm as ds_comm   # the module holding the live backend, cdb
        return ds_comm.cdb.shm_comm_op is None, deepspeed.ops.__compatible_ops__[SHM_OP]

    try:
        results = launch(start, world_size=2, timeout=120, show_output=False)
    finally:
        os.environ.pop("DS_ACCELERATOR", None)
    assert results == [(True, False), (True, False)]


def test_deepspeed_missing_names_the_fix(monkeypatch):
    from course_lib import deepspeed_cpu
    monkeypatch.setattr(deepspeed_cpu.importlib.util, "find_spec", lambda name: None)
    assert "pip install" in deepspeed_cpu.deepspeed_missing()


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
def test_low_precision_support_reports_the_cpu_accelerator_as_its_source_says():
    os.environ["DS_ACCELERATOR"] = "cpu"

    def ask():
        from course_lib.deepspeed_cpu import low_precision_support, start_deepspeed_on_cpu
        start_deepspeed_on_cpu()
        return low_precision_support()

    try:
        [support] = launch(ask, world_size=1, timeout=120, show_output=False)
    finally:
        os.environ.pop("DS_ACCELERATOR", None)
    assert support["accelerator"] == "cpu"
    assert support["is_bf16_supported"] is True
    assert support["onednn_fp16"] == bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    assert support["is_fp16_supported"] is (True if support["onednn_fp16"] else None)
