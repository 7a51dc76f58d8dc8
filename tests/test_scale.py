"""course_lib.scale (chapter 13): the formulas, against counts made another way."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from course_lib.scale import (ALGORITHMS, Link, all_reduce_seconds, comm_bound_tokens, flops_per_token, link_bytes,
                              state_bytes_per_rank)


def test_six_flops_per_weight_per_token_for_a_stack_of_linear_layers():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=False), nn.ReLU(), nn.Linear(32, 8, bias=False))
    x = torch.randn(5, 16, requires_grad=True)   # an input that needs its gradient, as inside a network
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    weights = 16 * 32 + 32 * 8
    assert counter.get_total_flops() == 5 * flops_per_token(weights, layers=0, d_model=0, seq_len=0)


def test_the_ring_sends_2_w_minus_1_over_w_and_doubling_k_times_s_per_step_between_nodes():
    assert link_bytes("ring", 2, 2, 1000) == 1500
    assert link_bytes("recursive doubling", 4, 2, 1000) == 4000      # log2(4) steps between nodes, 2 ranks each
    assert link_bytes("hierarchical", 4, 8, 1000) == 1500            # whatever the ranks per node
    assert link_bytes("ring", 1, 4, 1000) == 0.0


def test_predicted_times_follow_the_alpha_beta_model():
    link, local = Link(1e-3, 1e-8), Link(0.0, 0.0)
    assert all_reduce_seconds("ring", 2, 1, 1000, link, local) == pytest.approx(2 * (1e-3 + 500 * 1e-8))
    assert all_reduce_seconds("recursive doubling", 2, 2, 1000, link, local) == pytest.approx(1e-3 + 2000e-8)
    assert all_reduce_seconds("hierarchical", 2, 4, 1000, link, local) == pytest.approx(2 * (1e-3 + 500e-8))
    with pytest.raises(ValueError, match="power-of-two"):
        all_reduce_seconds("recursive doubling", 3, 1, 1000, link, local)
    with pytest.raises(ValueError, match="unknown algorithm"):
        all_reduce_seconds("tree", 2, 1, 1000, link, local)
    assert sorted(ALGORITHMS) == ["hierarchical", "recursive doubling", "ring"]


def test_the_comm_bound_batch_is_where_both_times_are_equal_whatever_the_model():
    for params in (1e6, 7e9):
        b = comm_bound_tokens(world_size=8, bytes_per_grad=2, flops_per_s=1e12, link_bytes_per_s=1e9)
        compute = 6 * params * b / 1e12
        communicate = 2 * 7 / 8 * params * 2 / 1e9
        assert math.isclose(compute, communicate)


def test_state_bytes_split_over_every_axis():
    assert state_bytes_per_rank(1024, dp_shard=4, tp=2, pp=2) == 1024 * 16 / 16
    assert state_bytes_per_rank(1024, bytes_per_param=12) == 1024 * 12
