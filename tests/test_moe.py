"""course_lib.moe (chapter 12): the reference layer and the routing arithmetic the chapter's checks use."""

import math

import torch

from course_lib.moe import (MoE, all_to_all_bytes, dropped_per_expert, expert_capacity, route, routing_numbers,
                            skewed_router_logits, tokens_per_expert)


def test_route_keeps_the_probability_for_one_choice_and_renormalises_several():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    probs = logits.softmax(-1)
    one = route(logits, 1)
    assert one.expert_ids.tolist() == [[0]] and torch.equal(one.gates, probs[:, :1])
    two = route(logits, 2)
    assert two.expert_ids.tolist() == [[0, 1]]
    torch.testing.assert_close(two.gates, probs[:, :2] / probs[:, :2].sum())


def test_the_grouped_layer_equals_the_formula_token_by_token_with_gradients():
    layer = MoE(6, 10, num_experts=4, top_k=2, shared_expert=True, seed=3)
    x = torch.randn(9, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    routing = layer.route(x)
    by_token = torch.stack([layer.shared(x[t]) + sum(routing.gates[t, j] * layer.experts[int(routing.expert_ids[t, j])](x[t])
                                                     for j in range(2)) for t in range(9)])
    torch.testing.assert_close(layer(x), by_token, rtol=0, atol=1e-12)
    layer(x).sum().backward()
    assert layer.router.weight.grad is not None and layer.router.weight.grad.abs().sum() > 0


def test_building_a_layer_leaves_the_callers_random_stream_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    MoE(4, 8, num_experts=2, seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_capacity_drops_and_bytes():
    assert expert_capacity(64, 4, 1.25) == 20                    # ceil(64 / 4 * 1.25)
    assert expert_capacity(8192, 64, 1.0, top_k=8) == 1024       # k T / E exactly
    assert expert_capacity(10, 3, 1.0) == 4                      # rounded up
    assert dropped_per_expert(torch.tensor([25, 3, 20]), 20).tolist() == [5, 0, 0]
    assert all_to_all_bytes(512, 1024, 2, 2, 0.75) == 512 * 2 * 1024 * 2 * 0.75


def test_a_skewed_router_favours_the_first_experts():
    even = tokens_per_expert(route(skewed_router_logits(4000, 4, 0.0), 1).expert_ids, 4)
    skewed = tokens_per_expert(route(skewed_router_logits(4000, 4, 3.0), 1).expert_ids, 4)
    assert even.max() < 1.2 * 1000 and skewed[0] > 2 * 1000 and skewed[3] < skewed[0] / 10


def test_the_explorers_numbers_add_up():
    numbers = routing_numbers(8, 2, 1.0, 1.0, tokens=128, ranks=4, hidden=16, bytes_per_element=4)
    assert int(numbers["load"].sum()) == 128 * 4 * 2
    assert numbers["capacity"] == math.ceil(2 * 128 * 4 / 8)
    assert int(numbers["dropped"].sum()) == int((numbers["load"] - numbers["capacity"]).clamp(min=0).sum())
    assert all(0 <= sent <= 128 * 2 * 16 * 4 for sent in numbers["sent_bytes"])
