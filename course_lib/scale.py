"""The arithmetic of scale: FLOPs, the time of collectives, when a step is communication-bound, memory per rank.

Introduced in chapter 13, where each formula is first checked against the course's own measurements
(a FLOP counter, a shaped link, shards read from a mesh) and then applied to published runs.

    flops_per_token(matmul_params, layers, d_model, seq_len)    # 6N + 12·L·d·T (PaLM, appendix B)
    all_reduce_seconds("ring", nodes, per_node, size, link, local)   # from α–β fits
    link_bytes("ring", nodes, per_node, size)                  # bytes out of each node
    comm_bound_tokens(world_size, bytes_per_grad, flops_per_s, link_bytes_per_s)
    state_bytes_per_rank(params, dp_shard, tp, pp)              # mixed-precision Adam: 16 bytes a parameter
    activation_bytes_per_layer(tokens, seq_len, d_model, ffn, heads, ...)   # what one block keeps for backward
    activation_bytes_per_rank(model, seq_len, layout, ...)      # layers held x micro-batches in flight
    layout_memory(model, seq_len, layout), layout_seconds(model, cluster, seq_len, global_batch, layout)
    plan_layouts(model, cluster, seq_len, global_batch)         # the layouts that fit, fastest first
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Link", "flops_per_token", "all_reduce_seconds", "link_bytes", "ALGORITHMS", "comm_bound_tokens",
           "state_bytes_per_rank", "activation_bytes_per_layer", "activation_bytes_per_rank", "Decoder", "Cluster",
           "Layout", "layout_memory", "layout_seconds", "layout_problem", "plan_layouts", "plan_table"]


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


# ---- activations: what a block keeps for its backward pass (chapter 13's `Block`: pre-norm attention with a
# ---- fused qkv projection, then a two-matrix MLP), counted tensor by tensor with saved_tensors_hooks.
NORM_STATS_BYTES = 16   # per token and block: two layer norms, each keeping a mean and a 1/std in float32


def activation_bytes_per_layer(tokens: int, seq_len: int, d_model: int, ffn: int, heads: int,
                               bytes_per_value: int = 4, tp: int = 1, sequence_parallel: bool = False,
                               scores_stored: bool = True) -> float:
    """Bytes one block keeps from its forward pass for its backward, for ``tokens`` tokens (micro-batch x
    sequence length), its weights not counted. Per token:

    * 4·d values every tensor-parallel rank holds whole: the block's input, the first norm's output, the
      residual after attention, the second norm's output (split over tp too with sequence parallelism);
    * 4·d + 2·ffn values split over tp: q, k, v, attention's output, the MLP's input and output of its
      activation function;
    * heads·seq_len values of softmax probabilities, split over tp, unless a fused (flash) attention kernel
      recomputes them (``scores_stored=False``);
    * the norms' statistics (16 bytes of float32, held like the block's input);
    and per block a seq_len x seq_len boolean causal mask when the scores are stored."""
    whole = 4 * d_model * bytes_per_value + NORM_STATS_BYTES
    split = (4 * d_model + 2 * ffn + (heads * seq_len if scores_stored else 0)) * bytes_per_value
    per_token = (whole + split) / tp if sequence_parallel else whole + split / tp
    return tokens * per_token + (seq_len * seq_len if scores_stored else 0)


@dataclass(frozen=True)
class Decoder:
    """A decoder of ``layers`` blocks as in chapter 13 (``params`` defaults to its weights: 4d² + 2·d·ffn per
    block, and a d x vocab embedding and output layer each)."""
    layers: int
    d_model: int
    heads: int
    ffn: int
    vocab: int
    params: float | None = None

    @property
    def n_params(self) -> float:
        if self.params is not None:
            return self.params
        return self.layers * (4 * self.d_model**2 + 2 * self.d_model * self.ffn) + 2 * self.vocab * self.d_model


@dataclass(frozen=True)
class Cluster:
    """``gpus`` GPUs, ``gpus_per_node`` to a node, each with ``memory_bytes`` and ``flops_per_s`` that it
    achieves on the model's matrix multiplies; a link inside a node of ``intra_bytes_per_s`` per GPU and
    one between nodes of ``inter_bytes_per_s`` per GPU."""
    gpus: int
    gpus_per_node: int
    memory_bytes: float
    flops_per_s: float
    intra_bytes_per_s: float
    inter_bytes_per_s: float


@dataclass(frozen=True)
class Layout:
    """dp x tp x pp ranks: FSDP (ZeRO-3) over dp, tensor parallelism with sequence parallelism over tp (inside a
    node), a 1F1B pipeline over pp; micro-batches of ``micro_batch`` sequences; ``recompute``: every block's
    activations recomputed in the backward pass (full activation checkpointing)."""
    dp: int
    tp: int
    pp: int
    recompute: bool = False
    micro_batch: int = 1


def activation_bytes_per_rank(model: Decoder, seq_len: int, layout: Layout, micro_batches: int | None = None,
                              bytes_per_value: int = 2, scores_stored: bool = False) -> float:
    """Activations held at the peak by the pipeline's first stage: ``layers / pp`` blocks for each micro-batch
    in flight (1F1B: at most pp, fewer when there are fewer micro-batches; ceil(layers / pp) blocks when the
    stages are uneven). With recomputation, each block
    keeps only its input, and the block being recomputed holds all of its own for one micro-batch."""
    tokens = layout.micro_batch * seq_len
    in_flight = layout.pp if micro_batches is None else min(layout.pp, micro_batches)
    held = math.ceil(model.layers / layout.pp)
    full = activation_bytes_per_layer(tokens, seq_len, model.d_model, model.ffn, model.heads, bytes_per_value,
                                      tp=layout.tp, sequence_parallel=layout.tp > 1, scores_stored=scores_stored)
    if not layout.recompute:
        return in_flight * held * full
    block_input = tokens * model.d_model * bytes_per_value / layout.tp
    return in_flight * held * block_input + full


def _micro_batches(global_batch: int, layout: Layout) -> int:
    return global_batch // (layout.dp * layout.micro_batch)


def layout_memory(model: Decoder, seq_len: int, global_batch: int, layout: Layout) -> dict:
    """Bytes one GPU holds: training state (bf16 weights and gradients, fp32 master weights and Adam's two
    moments: 16 bytes a parameter, sharded over every rank by FSDP) and activations (bf16)."""
    state = state_bytes_per_rank(model.n_params, dp_shard=layout.dp, tp=layout.tp, pp=layout.pp)
    activations = activation_bytes_per_rank(model, seq_len, layout, _micro_batches(global_batch, layout))
    return {"state": state, "activations": activations, "total": state + activations}


def layout_seconds(model: Decoder, cluster: Cluster, seq_len: int, global_batch: int, layout: Layout) -> dict:
    """Predicted seconds of one step of ``global_batch`` sequences, nothing overlapped:

    * compute: (6N + 12LdT) FLOPs a token (4/3 of it with recomputation: one more forward), spread evenly
      over the GPUs;
    * tensor parallelism: four all-reduces (ring, bandwidth term) of a micro-batch's activations (bf16) per
      block and micro-batch, two forward and two backward, six with recomputation, over the node's link;
    * the pipeline's bubble: compute and tensor-parallel time stretched by (m + pp - 1) / m for m micro-batches;
    * FSDP: all-gather the weights forward and backward, reduce-scatter the gradients, 3·(dp-1)/dp of the
      rank's bf16 weights, over the node's link when the dp group fits in a node, between nodes otherwise."""
    world = cluster.gpus
    tokens = global_batch * seq_len
    flops = flops_per_token(model.n_params, model.layers, model.d_model, seq_len) * tokens
    compute = flops * (4 / 3 if layout.recompute else 1) / (world * cluster.flops_per_s)
    m = _micro_batches(global_batch, layout)
    activation = layout.micro_batch * seq_len * model.d_model * 2
    per_all_reduce = 2 * (layout.tp - 1) / layout.tp * activation / cluster.intra_bytes_per_s
    tp = m * (model.layers // layout.pp) * (6 if layout.recompute else 4) * per_all_reduce
    bubble = (compute + tp) * (layout.pp - 1) / m
    dp_link = cluster.intra_bytes_per_s if layout.dp * layout.tp <= cluster.gpus_per_node else cluster.inter_bytes_per_s
    dp = 3 * (layout.dp - 1) / layout.dp * model.n_params * 2 / (layout.tp * layout.pp) / dp_link
    return {"compute": compute, "tp": tp, "bubble": bubble, "dp": dp, "total": compute + tp + bubble + dp}


def layout_problem(model: Decoder, cluster: Cluster, global_batch: int, layout: Layout) -> str | None:
    """Why ``layout`` cannot run this model on this cluster (memory aside), or None."""
    if layout.dp * layout.tp * layout.pp != cluster.gpus:
        return f"dp x tp x pp = {layout.dp * layout.tp * layout.pp}, not the cluster's {cluster.gpus} GPUs"
    if layout.tp > cluster.gpus_per_node or cluster.gpus_per_node % layout.tp:
        return f"tp = {layout.tp} does not fit in a node of {cluster.gpus_per_node} GPUs"
    if model.heads % layout.tp or model.ffn % layout.tp:
        return f"tp = {layout.tp} does not divide the {model.heads} heads and the ffn width {model.ffn}"
    if model.layers % layout.pp:
        return f"pp = {layout.pp} does not divide the {model.layers} layers"
    if global_batch % (layout.dp * layout.micro_batch):
        return f"{global_batch} sequences do not split into micro-batches of {layout.micro_batch} over dp = {layout.dp}"
    return None


def _powers_of_two_up_to(n: int) -> list[int]:
    return [2**k for k in range(n.bit_length()) if n % 2**k == 0]


def plan_layouts(model: Decoder, cluster: Cluster, seq_len: int, global_batch: int, micro_batch: int = 1) -> list[dict]:
    """Every dp x tp x pp layout (tp and pp powers of two, recomputation on or off) that runs and fits in a GPU's
    memory, fastest predicted step first (ties: fewer tp, then fewer pp, then no recomputation)."""
    rows = []
    for tp in _powers_of_two_up_to(cluster.gpus):
        for pp in _powers_of_two_up_to(cluster.gpus // tp):
            for recompute in (False, True):
                layout = Layout(cluster.gpus // (tp * pp), tp, pp, recompute, micro_batch)
                if layout_problem(model, cluster, global_batch, layout) is not None:
                    continue
                memory = layout_memory(model, seq_len, global_batch, layout)
                if memory["total"] > cluster.memory_bytes:
                    continue
                rows.append({"layout": layout, "memory": memory,
                             "seconds": layout_seconds(model, cluster, seq_len, global_batch, layout)})
    return sorted(rows, key=lambda r: (r["seconds"]["total"], r["layout"].tp, r["layout"].pp, r["layout"].recompute))


def plan_table(rows: list[dict], top: int = 8) -> str:
    """The first ``top`` rows of plan_layouts as a fixed-width table (GB = 1e9 bytes, times in seconds)."""
    lines = [f"{'dp':>5} {'tp':>3} {'pp':>3} {'recompute':>9} | {'state GB':>8} {'activ. GB':>9} | "
             f"{'compute':>8} {'tp comm':>8} {'bubble':>8} {'dp comm':>8} {'step s':>8}"]
    for row in rows[:top]:
        lay, mem, sec = row["layout"], row["memory"], row["seconds"]
        lines.append(f"{lay.dp:>5} {lay.tp:>3} {lay.pp:>3} {'yes' if lay.recompute else 'no':>9} | "
                     f"{mem['state'] / 1e9:>8.2f} {mem['activations'] / 1e9:>9.2f} | {sec['compute']:>8.3f} "
                     f"{sec['tp']:>8.3f} {sec['bubble']:>8.3f} {sec['dp']:>8.3f} {sec['total']:>8.3f}")
    return "\n".join(lines)
