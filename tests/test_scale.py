"""course_lib.scale (chapter 13): the formulas, against counts made another way."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from course_lib.scale import (ALGORITHMS, Cluster, Decoder, Layout, Link, activation_bytes_per_layer,
                              activation_bytes_per_rank, all_reduce_seconds, comm_bound_tokens, flops_per_token,
                              layout_memory, layout_problem, layout_seconds, link_bytes, plan_layouts, plan_table,
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


class Block(nn.Module):   # chapter 13's block
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        attended = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def saved_bytes(blocks, x, recompute=False):
    """Bytes of the distinct tensors (weights excluded) that autograd keeps for the backward pass."""
    weights = {p.untyped_storage().data_ptr() for b in blocks for p in b.parameters()}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for block in blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if recompute else block(x)
    return sum(kept.values())


@pytest.mark.parametrize("batch, seq, d, heads", [(3, 32, 64, 4), (2, 16, 32, 2)])
def test_activation_bytes_per_layer_equals_what_autograd_keeps(batch, seq, d, heads):
    torch.manual_seed(0)
    blocks = [Block(d, heads) for _ in range(3)]
    x = torch.randn(batch, seq, d, requires_grad=True)
    one = activation_bytes_per_layer(batch * seq, seq, d, 4 * d, heads)
    # the first block's input is the leaf x, which autograd keeps too: count blocks 2 and 3 by difference
    assert saved_bytes(blocks, x) - saved_bytes(blocks[:1], x) == 2 * one
    assert saved_bytes(blocks, x, recompute=True) - saved_bytes(blocks[:1], x, recompute=True) == 2 * batch * seq * d * 4


def test_activations_split_over_tp_and_held_per_micro_batch_in_flight():
    per_token = activation_bytes_per_layer(1, 8, 64, 256, 4, bytes_per_value=2, scores_stored=False)
    assert per_token == 4 * 64 * 2 + 16 + (4 * 64 + 2 * 256) * 2
    split = activation_bytes_per_layer(1, 8, 64, 256, 4, bytes_per_value=2, tp=4, scores_stored=False)
    assert split == 4 * 64 * 2 + 16 + (4 * 64 + 2 * 256) * 2 / 4
    assert activation_bytes_per_layer(1, 8, 64, 256, 4, 2, tp=4, sequence_parallel=True, scores_stored=False) == per_token / 4
    model = Decoder(layers=8, d_model=64, heads=4, ffn=256, vocab=100)
    full = activation_bytes_per_layer(16, 16, 64, 256, 4, 2, tp=2, sequence_parallel=True, scores_stored=False)
    assert activation_bytes_per_rank(model, 16, Layout(1, 2, 4)) == 4 * 2 * full              # pp in flight x L/pp
    assert activation_bytes_per_rank(model, 16, Layout(1, 2, 4), micro_batches=2) == 2 * 2 * full
    assert activation_bytes_per_rank(model, 16, Layout(1, 2, 4, recompute=True)) == 4 * 2 * 16 * 64 * 2 / 2 + full


def test_layout_memory_and_seconds_add_up():
    model = Decoder(layers=8, d_model=64, heads=4, ffn=256, vocab=100)
    assert model.n_params == 8 * (4 * 64**2 + 2 * 64 * 256) + 2 * 100 * 64
    cluster = Cluster(gpus=8, gpus_per_node=4, memory_bytes=1e9, flops_per_s=1e12, intra_bytes_per_s=1e11,
                      inter_bytes_per_s=1e10)
    layout = Layout(dp=2, tp=2, pp=2)
    memory = layout_memory(model, 16, 8, layout)
    assert memory["state"] == model.n_params * 16 / 8
    assert memory["total"] == memory["state"] + memory["activations"]
    seconds = layout_seconds(model, cluster, 16, 8, layout)
    compute = flops_per_token(model.n_params, 8, 64, 16) * 8 * 16 / (8 * 1e12)
    tp = 4 * (8 // 2) * (8 // 2) * (16 * 64 * 2) / 1e11          # 4 micro-batches x 4 layers x 4 all-reduces of 2(t-1)/t S
    assert seconds["compute"] == pytest.approx(compute)
    assert seconds["tp"] == pytest.approx(tp)
    assert seconds["bubble"] == pytest.approx((compute + tp) / 4)
    assert seconds["dp"] == pytest.approx(3 * 0.5 * model.n_params * 2 / 4 / 1e11)   # dp x tp = 4 GPUs: one node
    assert seconds["total"] == pytest.approx(sum(v for k, v in seconds.items() if k != "total"))
    slower = layout_seconds(model, cluster, 16, 8, Layout(dp=4, tp=2, pp=1))["dp"]      # dp x tp = 8: between nodes
    assert slower == pytest.approx(3 * 0.75 * model.n_params * 2 / 2 / 1e10)
    assert layout_problem(model, cluster, 8, Layout(dp=1, tp=8, pp=1)) == "tp = 8 does not fit in a node of 4 GPUs"
    assert layout_problem(Decoder(6, 64, 4, 256, 100), cluster, 8, Layout(dp=1, tp=1, pp=8)) == "pp = 8 does not divide the 6 layers"


def test_plan_layouts_keeps_what_fits_fastest_first():
    model = Decoder(layers=32, d_model=4096, heads=32, ffn=16384, vocab=32000)
    cluster = Cluster(gpus=32, gpus_per_node=8, memory_bytes=16e9, flops_per_s=400e12, intra_bytes_per_s=450e9,
                      inter_bytes_per_s=50e9)
    rows = plan_layouts(model, cluster, 4096, 256)
    assert rows
    totals = [r["seconds"]["total"] for r in rows]
    assert totals == sorted(totals)
    assert all(r["memory"]["total"] <= 16e9 for r in rows)
    assert len(plan_table(rows, top=3).splitlines()) == 4
    # a layout that holds every block's activations whole does not fit in 16 GB
    assert layout_memory(model, 4096, 256, Layout(32, 1, 1))["total"] > 16e9
    assert all(r["layout"] != Layout(32, 1, 1) for r in rows)
