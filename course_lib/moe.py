"""Mixture of experts: the one-process reference layer, and the arithmetic of routing.

Introduced in chapter 12 (mixture of experts and expert parallelism). The chapter builds the
expert-parallel layer itself, in the notebook; this module holds what the lesson, its exercises
and their checks share:

* ``Expert`` and ``MoE``: a router, top-k gating, routed experts and an optional shared expert,
  computed in one process. It is the reference every distributed version is compared with.
* ``route``: the router's probabilities, each token's top-k experts and their gates.
* ``expert_capacity``, ``dropped_per_expert``, ``all_to_all_bytes``: the formulas the checks use
  (Switch Transformer, arXiv:2101.03961; GShard, arXiv:2006.16668), so the explorer draws from the
  same arithmetic that is checked.
* ``skewed_router_logits``, ``plot_expert_load``, ``plot_traffic``, ``routing_explorer``: routers of a
  chosen skew, and pictures of what they do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Expert", "MoE", "Routing", "route", "expert_capacity", "dropped_per_expert", "all_to_all_bytes",
           "tokens_per_expert", "skewed_router_logits", "plot_expert_load", "plot_traffic", "show_routing",
           "routing_explorer"]


class Expert(nn.Module):
    """One feed-forward expert: hidden -> ffn -> hidden, SiLU between (as in the dense MLP it replaces)."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


@dataclass
class Routing:
    """What the router decided for T tokens and E experts, choosing k per token."""
    probs: torch.Tensor        # (T, E) softmax over all experts: the load-balancing loss reads it
    expert_ids: torch.Tensor   # (T, k) each token's chosen experts, best first
    gates: torch.Tensor        # (T, k) the weight of each chosen expert's output


def route(logits: torch.Tensor, top_k: int) -> Routing:
    """Softmax over the experts, then each token's top_k. With k > 1 the k gates are renormalised
    to sum to 1 (Mixtral and DeepSeek-V3 do; Switch's k = 1 keeps the raw probability, so the
    router still gets a gradient through the gate)."""
    probs = F.softmax(logits, dim=-1)
    gates, expert_ids = probs.topk(top_k, dim=-1)
    if top_k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return Routing(probs, expert_ids, gates)


class MoE(nn.Module):
    """A mixture-of-experts layer in one process: the reference.

    ``forward(x)`` takes tokens ``(T, hidden)`` and returns ``(T, hidden)``: the shared expert's
    output (if any) plus, for each token, the gate-weighted sum of its top-k routed experts' outputs.
    Each expert runs once, on the tokens routed to it (grouped), as a real implementation does.
    """

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int = 1, shared_expert: bool = False,
                 seed: int = 0, dtype=torch.float64):
        super().__init__()
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.top_k = top_k
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))
        self.shared = Expert(hidden, ffn) if shared_expert else None
        self.to(dtype)
        torch.random.set_rng_state(generator_state)  # building a layer leaves the caller's seed alone

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    def route(self, x) -> Routing:
        return route(self.router(x), self.top_k)

    def forward(self, x, routing: Routing | None = None):
        routing = self.route(x) if routing is None else routing
        out = torch.zeros_like(x) if self.shared is None else self.shared(x)
        for e, expert in enumerate(self.experts):
            token, slot = (routing.expert_ids == e).nonzero(as_tuple=True)   # who chose e, as which choice
            if len(token):
                weighted = routing.gates[token, slot].unsqueeze(-1) * expert(x[token])
                out = out.index_add(0, token, weighted)
        return out


def tokens_per_expert(expert_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many (token, choice) pairs each expert receives: its load."""
    return torch.bincount(expert_ids.reshape(-1), minlength=num_experts)


def expert_capacity(tokens: int, num_experts: int, capacity_factor: float, top_k: int = 1) -> int:
    """Slots per expert: the tokens' k choices spread evenly, times the capacity factor, rounded up
    (Switch: tokens per batch / experts x capacity factor; GShard counts k choices per token)."""
    return math.ceil(top_k * tokens / num_experts * capacity_factor)


def dropped_per_expert(load: torch.Tensor, capacity: int) -> torch.Tensor:
    """Choices an expert cannot take: whatever its load exceeds its capacity by."""
    return (load - capacity).clamp(min=0)


def all_to_all_bytes(tokens: int, hidden: int, bytes_per_element: int, top_k: int, share_leaving: float) -> float:
    """Bytes one rank sends in one dispatch all-to-all (the combine sends as many back): each of its
    tokens' k choices whose expert lives on another rank carries one hidden vector."""
    return tokens * top_k * hidden * bytes_per_element * share_leaving


def skewed_router_logits(tokens: int, num_experts: int, skew: float, seed: int = 0, dtype=torch.float64):
    """Router logits for ``tokens`` tokens: random, plus ``skew`` times a ramp that favours expert 0
    over expert E-1. skew = 0 is a balanced router; skew = 3 sends most choices to the first few."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(tokens, num_experts, generator=generator, dtype=dtype)
    ramp = torch.linspace(1.0, 0.0, num_experts, dtype=dtype)
    return noise + skew * ramp


def plot_expert_load(load, capacity: int | None = None, ax=None, title: str = ""):
    """Bars of each expert's load; with a capacity, the part above it (dropped) in red."""
    import matplotlib.pyplot as plt

    load = torch.as_tensor(load)
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 2.6), dpi=80)
    experts = range(len(load))
    kept = load if capacity is None else load.clamp(max=capacity)
    ax.bar(experts, kept.tolist(), color="#4C72B0", label="kept")
    if capacity is not None:
        ax.bar(experts, dropped_per_expert(load, capacity).tolist(), bottom=kept.tolist(), color="#C44E52",
               label="dropped")
        ax.axhline(capacity, color="black", linestyle="--", linewidth=1, label=f"capacity {capacity}")
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens routed")
    ax.set_xticks(list(experts))
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small", frameon=False)
    return ax


def plot_traffic(matrix, ax=None, title: str = "bytes sent, rank to rank"):
    """A heat map of an all-to-all: row = sending rank, column = receiving rank, each cell labelled."""
    import matplotlib.pyplot as plt

    matrix = torch.as_tensor(matrix, dtype=torch.float64)
    if ax is None:
        _, ax = plt.subplots(figsize=(3.4, 3.0), dpi=80)
    ax.imshow(matrix.numpy(), cmap="Reds")
    n = matrix.shape[0]
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{matrix[i, j]:.0f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("to rank")
    ax.set_ylabel("from rank")
    ax.set_title(title, fontsize="medium")
    return ax


def routing_numbers(num_experts: int, top_k: int, capacity_factor: float, skew: float, tokens: int = 512,
                    ranks: int = 4, hidden: int = 1024, bytes_per_element: int = 2):
    """One routing of ``tokens`` tokens per rank on ``ranks`` ranks (experts spread evenly over them):
    each expert's load, its capacity, what is dropped, and the bytes each rank sends in dispatch."""
    loads, leaving = [], []
    for rank in range(ranks):
        routing = route(skewed_router_logits(tokens, num_experts, skew, seed=rank), top_k)
        loads.append(tokens_per_expert(routing.expert_ids, num_experts))
        owner = routing.expert_ids // (num_experts // ranks)     # the rank that holds each chosen expert
        leaving.append((owner != rank).double().mean().item())
    load = torch.stack(loads).sum(0)
    capacity = expert_capacity(tokens * ranks, num_experts, capacity_factor, top_k)
    sent = [all_to_all_bytes(tokens, hidden, bytes_per_element, top_k, share) for share in leaving]
    return {"load": load, "capacity": capacity, "dropped": dropped_per_expert(load, capacity), "sent_bytes": sent}


def show_routing(num_experts: int = 8, top_k: int = 2, capacity_factor: float = 1.25, skew: float = 0.0):
    """Draw one setting: expert loads with the capacity, and the dispatch bytes each rank sends."""
    import matplotlib.pyplot as plt

    numbers = routing_numbers(num_experts, top_k, capacity_factor, skew)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 2.8), dpi=80)
    dropped = int(numbers["dropped"].sum())
    plot_expert_load(numbers["load"], numbers["capacity"], ax=left,
                     title=f"E={num_experts}, k={top_k}, factor {capacity_factor}, skew {skew}: {dropped} dropped")
    right.bar(range(len(numbers["sent_bytes"])), [b / 2**20 for b in numbers["sent_bytes"]], color="#C44E52")
    right.set_xlabel("rank")
    right.set_ylabel("MiB sent per dispatch")
    right.set_title("dispatch all-to-all, 512 tokens/rank, hidden 1024, bf16", fontsize="medium")
    fig.tight_layout()
    plt.show()
    total = int(numbers["load"].sum())
    print(f"choices {total}, capacity {numbers['capacity']} per expert, dropped {dropped} "
          f"({dropped / total:.1%}); MiB sent per rank: " + " ".join(f"{b / 2**20:.2f}" for b in numbers["sent_bytes"]))


def routing_explorer():
    """Sliders over experts, k, capacity factor and skew, redrawing show_routing on every change."""
    import ipywidgets as widgets

    return widgets.interact(
        show_routing,
        num_experts=widgets.Dropdown(options=[4, 8, 16, 32], value=8, description="experts"),
        top_k=widgets.IntSlider(value=2, min=1, max=4, description="k"),
        capacity_factor=widgets.FloatSlider(value=1.25, min=0.5, max=4.0, step=0.25, description="capacity"),
        skew=widgets.FloatSlider(value=0.0, min=0.0, max=4.0, step=0.5, description="skew"))
