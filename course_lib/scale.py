"""The arithmetic of scale: FLOPs, the time of collectives, when a step is communication-bound, memory per rank.

Introduced in chapter 13, where each formula is first checked against the course's own measurements
(a FLOP counter, a shaped link, shards read from a mesh) and then applied to published runs.

    flops_per_token(matmul_params, layers, d_model, seq_len)    # 6N + 12·L·d·T (PaLM, appendix B)
    all_reduce_seconds("ring", nodes, per_node, size, link, local)   # from α–β fits
    link_bytes("ring", nodes, per_node, size)                  # bytes out of each node
    comm_bound_tokens(world_size, bytes_per_grad, flops_per_s, link_bytes_per_s)
    state_bytes_per_rank(params, dp_shard, tp, pp)              # mixed-precision Adam: 16 bytes a parameter
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Link", "flops_per_token", "all_reduce_seconds", "link_bytes", "ALGORITHMS", "comm_bound_tokens",
           "state_bytes_per_rank"]


@dataclass(frozen=True)
class Link:
    """t(S) = alpha + beta * S for a message of S bytes (alpha in seconds, beta in seconds per byte)."""
    alpha: float
    beta: float

    def seconds(self, size_bytes: float) -> float:
        return self.alpha + self.beta * size_bytes


def flops_per_token(matmul_params: int, layers: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token of a decoder: 6 per weight of the matrix multiplies (2 forward, 4 backward)
    and 12·L·d·T for attention's two products with the keys and values (QKᵀ and AV, causal mask ignored)."""
    return 6 * matmul_params + 12 * layers * d_model * seq_len


# ---- all-reduce time on nodes of `per_node` ranks, block placement (ranks 0..per_node-1 on node 0, ...),
# ---- a link per node to a switch (each node's link is shared by the node's ranks), the node's loopback inside.
def _ring(nodes, per_node, size, link, local):
    world = nodes * per_node
    if world == 1:
        return 0.0
    # 2(W-1) steps; every step, one chunk of S/W crosses each edge of the ring at once, and the slowest
    # edge (between two nodes, when there are several) sets the step's time.
    edge = link if nodes > 1 else local
    return 2 * (world - 1) * edge.seconds(size / world)


def _doubling(nodes, per_node, size, link, local):
    world = nodes * per_node
    if world & (world - 1):
        raise ValueError(f"recursive doubling needs a power-of-two world size, got {world}")
    total, distance = 0.0, 1
    while distance < world:
        if distance < per_node:     # the partner is on this node
            total += local.seconds(size)
        else:                       # every rank of the node sends its whole tensor over the node's link
            total += link.alpha + per_node * size * link.beta
        distance *= 2
    return total


def _hierarchical(nodes, per_node, size, link, local):
    # Inside each node, its ranks send their tensor to the node's first rank, one after another; the first
    # ranks all-reduce over a ring of nodes; then each sends the sum back to its node's ranks.
    inside = 2 * (per_node - 1) * local.seconds(size)
    return inside + _ring(nodes, 1, size, link, local)


ALGORITHMS = {"ring": _ring, "recursive doubling": _doubling, "hierarchical": _hierarchical}


def link_bytes(algorithm: str, nodes: int, per_node: int, size_bytes: float) -> float:
    """Bytes one all-reduce of ``size_bytes`` sends out of each node over its link (payload, no headers)."""
    world = nodes * per_node
    if nodes == 1:
        return 0.0
    if algorithm == "ring":                 # one edge of the ring leaves each node
        return 2 * (world - 1) / world * size_bytes
    if algorithm == "recursive doubling":   # the steps between nodes: every rank sends its whole tensor
        return math.log2(nodes) * per_node * size_bytes
    if algorithm == "hierarchical":         # only the node's first rank, in a ring of nodes
        return 2 * (nodes - 1) / nodes * size_bytes
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}")


def all_reduce_seconds(algorithm: str, nodes: int, per_node: int, size_bytes: float, link: Link,
                       local: Link) -> float:
    """Predicted seconds of one all-reduce of ``size_bytes`` by ``algorithm`` (a key of ALGORITHMS)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {sorted(ALGORITHMS)}")
    return ALGORITHMS[algorithm](nodes, per_node, size_bytes, link, local)


def comm_bound_tokens(world_size: int, bytes_per_grad: float, flops_per_s: float, link_bytes_per_s: float) -> float:
    """Tokens (or samples) per rank below which a data-parallel step spends longer all-reducing its gradients
    (a ring, bandwidth only) than computing them. Compute: 6N·b / F; communication: 2(W-1)/W·N·p / BW.
    They are equal at b = (W-1)/W · p·F / (3·BW): the parameter count N cancels."""
    return (world_size - 1) / world_size * bytes_per_grad * flops_per_s / (3 * link_bytes_per_s)


def state_bytes_per_rank(params: int, dp_shard: int = 1, tp: int = 1, pp: int = 1,
                         bytes_per_param: int = 16) -> float:
    """Parameters, gradients and optimizer state held by one rank when tensor and pipeline parallelism split
    the model tp·pp ways and FSDP shards each piece over dp_shard ranks (mixed-precision Adam: 2 + 2 + 12
    bytes a parameter; fp32 Adam: 4 + 4 + 8). Assumes every piece splits evenly."""
    return params * bytes_per_param / (dp_shard * tp * pp)
