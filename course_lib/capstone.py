"""A small GPT, its text, and the pieces that compose data, pipeline and tensor parallelism.

Defined in chapter 11 (the capstone), which teaches each piece before it uses it here; the
exercises of chapter 11 run learners' layouts through the same code::

    from course_lib.capstone import GPTConfig, make_gpt, training_batch, ParallelGPT

    config = GPTConfig()                       # 4 blocks, width 64, context 32, 48 symbols
    model = make_gpt(config)                   # float64, the same weights in every process
    x, y = training_batch(step=0, batch_size=8, context=config.context)

    # in a worker of an 8-rank launch:
    mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "pp", "tp"))
    model = ParallelGPT(mesh, config, n_microbatches=2)
    loss = model.train_step(x, y)              # this rank's share of the batch is taken inside

The composition follows torchtitan's order: split the model into pipeline stages
(``stage_module``), apply the tensor-parallel plan to each stage (``tensor_parallel_plan``,
``tensor_parallelize``), shard each block and stage with FSDP2 on the ``dp`` axis
(``fsdp_shard``), then wrap the stages for ``torch.distributed.pipelining``
(``pipeline_schedule``). Chapter 11, section 3, writes those steps in the notebook, one at a
time; ``ParallelGPT`` composes the ones here for the exercises, and the chapter checks that both
train bit for bit alike. Dropout is left out of the model so that every layout can be compared
with one process to the last bits.

``save_checkpoint`` and ``load_checkpoint`` (section 9) write a ``ParallelGPT``'s shards and its Adam
state with ``torch.distributed.checkpoint`` under one layout and read them back under another.
"""

from __future__ import annotations

import codecs
import logging
import time
import warnings
import contextlib
import copy
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["GPTConfig", "TEXT", "SYMBOLS", "encode", "decode", "training_batch", "make_gpt", "GPT",
           "cross_entropy", "stage_module", "tensor_parallel_plan", "tensor_parallelize", "fsdp_shard",
           "pipeline_schedule", "place_gradients_like_parameters", "ParallelGPT", "checkpoint_options",
           "checkpoint_state", "save_checkpoint", "load_checkpoint", "AxisCount",
           "gathered_parameters", "tp_local_parameters", "parameter_count", "communication_per_step",
           "wire_factor", "axis_bandwidths", "step_time_model"]


def _zen_of_python() -> str:
    # Shipped with every Python (``import this`` prints it), so the course needs no download.
    import this  # noqa: F401  (importing prints the poem once; we read the encoded copy)
    return codecs.decode(this.s, "rot13")


with contextlib.redirect_stdout(None):
    TEXT = _zen_of_python()
# Padded to 48 symbols: a vocabulary that splits evenly over 2, 3, 4, 6 or 8 tensor-parallel ranks
# (GPT-2's 50257 tokens divide by none of them; chapter 11's large model rounds them up to 50304, a multiple
# of 64, which all of them divide). The pad symbols never occur.
SYMBOLS = sorted(set(TEXT)) + [f"<pad{i}>" for i in range(48 - len(set(TEXT)))]


def encode(text: str) -> torch.Tensor:
    index = {s: i for i, s in enumerate(SYMBOLS)}
    return torch.tensor([index[c] for c in text])


def decode(ids) -> str:
    return "".join(SYMBOLS[int(i)] for i in ids)


def training_batch(step: int, batch_size: int, context: int, seed: int = 0):
    """``batch_size`` windows of the text at positions drawn from (seed, step): inputs and next symbols."""
    data = encode(TEXT)
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    starts = torch.randint(0, len(data) - context - 1, (batch_size,), generator=g)
    windows = torch.stack([data[s:s + context + 1] for s in starts.tolist()])
    # Contiguous copies, not views of `windows` (strides of context + 1): torch 2.11's pipeline stages
    # check a first stage's input strides against the contiguous ones its shape inference recorded.
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 48
    width: int = 64
    heads: int = 4
    context: int = 32
    layers: int = 4


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(c.width, c.width, bias=False) for _ in range(4))
        self.head_dim = c.width // c.heads

    def forward(self, x):
        B, S, _ = x.shape
        # -1 heads, not c.heads: under tensor parallelism a rank's q, k, v hold only its heads.
        q, k, v = (f(x).view(B, S, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.up, self.down = nn.Linear(c.width, 4 * c.width), nn.Linear(4 * c.width, c.width)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c.width), Attention(c)
        self.ln2, self.mlp = nn.LayerNorm(c.width), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A stage of a pipeline keeps some of ``blocks`` and has None for the ends it does not own."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.tok, self.pos = nn.Embedding(c.vocab, c.width), nn.Embedding(c.context, c.width)
        self.blocks = nn.ModuleDict({str(i): Block(c) for i in range(c.layers)})
        self.ln_f, self.head = nn.LayerNorm(c.width), nn.Linear(c.width, c.vocab, bias=False)

    def forward(self, x):
        if self.tok is not None:                  # first stage: x holds symbol ids
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]).unsqueeze(0))
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:                 # last stage: logits over the vocabulary
            x = self.head(self.ln_f(x))
        return x


def make_gpt(config: GPTConfig = GPTConfig(), seed: int = 0) -> GPT:
    """float64, so that every layout can be compared with one process to ~1e-12."""
    torch.manual_seed(seed)
    return GPT(config).double()


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def stage_module(full: GPT, stage: int, n_stages: int) -> GPT:
    """Pipeline stage ``stage`` of ``n_stages``: a copy of the model without what it does not own."""
    part = copy.deepcopy(full)
    per_stage = len(full.blocks) // n_stages
    mine = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in list(part.blocks.keys()):
        if name not in mine:
            del part.blocks[name]
    if stage != 0:
        part.tok = part.pos = None
    if stage != n_stages - 1:
        part.ln_f = part.head = None
    return part


def tensor_parallel_plan(part: GPT, vocab_parallel: bool = False, loss_parallel: bool = False) -> tuple[dict, dict]:
    """torchtitan's plan with sequence parallelism: (plan for the stage's ends, plan for each block).

    Between blocks the activations are sharded on the sequence (``Shard(1)``); attention and MLP
    gather them (all-gather), their column-wise q/k/v/up and row-wise o/down matmuls need no
    communication in between, and o/down reduce-scatter back to sequence shards. With
    ``vocab_parallel`` the head's output stays sharded over the vocabulary (a loss must then
    combine the shards); with ``loss_parallel`` it stays sharded too, as a DTensor, for
    ``torch.distributed.tensor.parallel.loss_parallel``; otherwise it is gathered to full logits
    on every rank.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    ends = {}
    if part.tok is not None:
        ends["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        ends["pos"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if part.head is not None:
        ends["ln_f"] = SequenceParallel()
        ends["head"] = ColwiseParallel(input_layouts=Shard(1),
                                       output_layouts=Shard(-1) if vocab_parallel or loss_parallel else Replicate(),
                                       use_local_output=not loss_parallel)
    block = {
        "ln1": SequenceParallel(),
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(output_layouts=Shard(1)),
        "ln2": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
    }
    return ends, block


# The four steps of chapter 11's composition, in the order torchtitan applies them. Section 3 of
# the chapter writes each one and checks it before the next; ParallelGPT below composes them.
def tensor_parallelize(part: GPT, tp_mesh, vocab_parallel: bool = False, loss_parallel: bool = False) -> GPT:
    """Step 2: the tensor-parallel plan (with sequence parallelism) applied to a stage, in place."""
    from torch.distributed.tensor.parallel import parallelize_module
    ends, block_plan = tensor_parallel_plan(part, vocab_parallel, loss_parallel)
    parallelize_module(part, tp_mesh, ends)
    for block in part.blocks.values():
        parallelize_module(block, tp_mesh, block_plan)
    return part


def fsdp_shard(part: GPT, dp_mesh) -> GPT:
    """Step 3: FSDP2 on the data-parallel axis, one unit per block and one for the rest of the stage."""
    from torch.distributed.fsdp import fully_shard
    # FSDP2 warns when a wrapped module returns a view (in-place ops on it would skip a hook);
    # the last stage's logits are one, and nothing here writes into them.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    for block in part.blocks.values():
        fully_shard(block, mesh=dp_mesh)
    fully_shard(part, mesh=dp_mesh)
    return part


def pipeline_schedule(parts, stage_ids, n_stages: int, pp_mesh, schedule: str, n_microbatches: int, loss_fn):
    """Step 4: each part a ``PipelineStage`` on the pp group, driven by ``schedule`` (a class name of
    ``torch.distributed.pipelining.schedules``; interleaved ones take a list of stages)."""
    from torch.distributed.pipelining import PipelineStage, schedules
    stages = [PipelineStage(part, stage, n_stages, torch.device("cpu"), group=pp_mesh.get_group())
              for part, stage in zip(parts, stage_ids)]
    schedule_class = getattr(schedules, schedule)
    return schedule_class(stages if len(stages) > 1 else stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)


def place_gradients_like_parameters(parts) -> None:
    """Redistribute each DTensor gradient whose placement differs from its parameter's.

    Two gradients come out of backward placed unlike their parameters under tensor parallelism in
    this torch: a sequence-parallel norm's (replicated weight, each rank saw only its positions:
    Partial(sum)) and a row-wise embedding's (sharded table, Replicate gradient: the full table on
    every rank). With dp > 1 FSDP2 has already placed them as it reduce-scatters (``FSDPParam``
    redistributes each gradient's non-dp mesh dimensions) and this finds nothing to do; with
    dp = 1 it costs one all-reduce per norm parameter and frees the embeddings' other shards.
    Chapter 11 shows both: dp > 1 in section 3 (step 3), dp = 1 in section 7.
    """
    from torch.distributed.tensor import DTensor
    for part in parts:
        for p in part.parameters():
            g = p.grad
            if isinstance(g, DTensor) and g.placements != p.placements:
                p.grad = g.redistribute(placements=p.placements)


class ParallelGPT:
    """This rank's part of the GPT on a ("dp", "pp", "tp") mesh, with its optimizer and schedule.

    On a ("dp_replicate", "dp_shard", "pp", "tp") mesh, FSDP2 runs as HSDP: each parameter sharded
    over dp_shard and its shards replicated over dp_replicate, as in chapter 11's HSDP (exercise 3).

    Chapter 11's composition (stage split, tensor parallelism, FSDP2, pipeline schedule), packaged
    for the exercises. ``loss_fn(logits, targets)`` gets full logits, or with ``vocab_parallel=True``
    this rank's vocabulary shard of them (a plain tensor) and must return the mean loss over the
    micro-batch. ``schedule`` is a class name from ``torch.distributed.pipelining.schedules``;
    interleaved schedules give each rank ``stages_per_rank`` stages (rank r holds stages r, r + pp, ...).
    """

    def __init__(self, mesh, config: GPTConfig = GPTConfig(), *, seed: int = 0, n_microbatches: int = 2,
                 schedule: str = "Schedule1F1B", stages_per_rank: int = 1, lr: float = 1e-2,
                 loss_fn=cross_entropy, vocab_parallel: bool = False):
        self.mesh, self.loss_fn = mesh, loss_fn
        hsdp = "dp_replicate" in mesh.mesh_dim_names
        dp_mesh = mesh["dp_replicate", "dp_shard"] if hsdp else mesh["dp"]
        self.dp, self.pp, self.tp = dp_mesh.size(), mesh["pp"].size(), mesh["tp"].size()
        self.dp_rank = 0                                        # this rank's place among all dp ranks: its rows
        for size, index in zip(dp_mesh.shape, dp_mesh.get_coordinate()):
            self.dp_rank = self.dp_rank * size + index
        pp_rank = mesh["pp"].get_local_rank()
        n_stages = self.pp * stages_per_rank
        self.stage_ids = [pp_rank + k * self.pp for k in range(stages_per_rank)]
        full = make_gpt(config, seed)
        self.parts = []
        for stage in self.stage_ids:
            part = stage_module(full, stage, n_stages) if n_stages > 1 else full
            if self.tp > 1:
                tensor_parallelize(part, mesh["tp"], vocab_parallel)
            if self.dp > 1:
                fsdp_shard(part, dp_mesh)
            self.parts.append(part)
        self.optimizer = torch.optim.Adam([p for part in self.parts for p in part.parameters()], lr=lr)
        self.first = self.last = True
        if n_stages > 1:
            self.schedule = pipeline_schedule(self.parts, self.stage_ids, n_stages, mesh["pp"], schedule,
                                              n_microbatches, self._loss)
            self.first, self.last = 0 in self.stage_ids, n_stages - 1 in self.stage_ids

    def _loss(self, logits, targets):
        if hasattr(logits, "to_local"):                         # vocab-parallel: hand over the local shard
            logits = logits.to_local()
        return self.loss_fn(logits, targets)

    def my_slice(self, x, y):
        """This rank's rows of the global batch (contiguous blocks, by dp coordinate)."""
        rows = x.shape[0] // self.dp
        part = slice(self.dp_rank * rows, (self.dp_rank + 1) * rows)
        return x[part], y[part]

    def train_step(self, x, y):
        """One optimizer step on the global batch (x, y); returns this dp slice's mean loss on ranks
        that hold the last stage, None elsewhere."""
        self.optimizer.zero_grad()
        loss = self.forward_backward(x, y)
        self.optimizer.step()
        return loss

    def forward_backward(self, x, y):
        """Forward and backward of the global batch (x, y), each gradient placed like its parameter,
        no step; returns what ``train_step`` returns."""
        x, y = self.my_slice(x, y)
        loss = None
        if hasattr(self, "schedule"):
            losses = []
            self.schedule.step(*((x,) if self.first else ()), **(dict(target=y, losses=losses) if self.last else {}))
            if self.last:
                loss = torch.stack([part_loss.detach() for part_loss in losses]).mean()
        else:
            loss = self._loss(self.parts[0](x), y)
            loss.backward()
            loss = loss.detach()
        place_gradients_like_parameters(self.parts)
        return None if loss is None else loss.item()


# Chapter 11, section 9: a checkpoint saved under one layout and loaded under another. DCP knows a
# tensor by its name and cuts it by the global offsets each DTensor shard carries, so every layout
# must give a parameter the same name: stage_module keeps the whole model's names (stage 1 of 2
# holds blocks.2 and blocks.3, not a blocks.0 and blocks.1 of its own), and TP and FSDP2 rename
# nothing. The optimizer's state goes by the same names.
def checkpoint_options():
    """How ``get_state_dict`` and ``set_state_dict`` shape the state: sharded (the default), and the
    optimizer's hyperparameters stored per parameter name (``param_groups.<name>.lr``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    # By default the hyperparameters are one param_groups list that names its parameters: a different
    # list on every stage, saved under one key, so that one stage's list would stand for all.
    return StateDictOptions(flatten_optimizer_state_dict=True)


def checkpoint_state(model: ParallelGPT) -> dict:
    """This rank's ``{"model": ..., "optimizer": ...}`` as ``torch.distributed.checkpoint`` saves and
    loads it: the rank's shards (DTensors under tp or dp) and Adam's state, keyed by names in the whole GPT.

    On an optimizer that has not stepped yet, ``get_state_dict`` first creates the state (one step
    with zero gradients at learning rate 0), so that there is something to load into."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    if len(model.parts) != 1:
        raise ValueError(f"this rank holds {len(model.parts)} stages: get_state_dict names an optimizer's "
                         "parameters through one module, and ParallelGPT's one optimizer spans them all")
    model_state, optimizer_state = get_state_dict(model.parts[0], model.optimizer, options=checkpoint_options())
    return {"model": model_state, "optimizer": optimizer_state}


def save_checkpoint(model: ParallelGPT, folder) -> None:
    """Every rank writes the shards it holds into ``folder``, and rank 0 the ``.metadata`` that says
    which slice of which named tensor is where. A collective: call it on every rank."""
    import torch.distributed.checkpoint as dcp
    dcp.save(checkpoint_state(model), checkpoint_id=folder)


def load_checkpoint(model: ParallelGPT, folder, with_optimizer: bool = True) -> None:
    """Fill this rank's shards, and Adam's state, from a checkpoint saved under any layout: each rank
    reads the slices of the saved chunks that its own shards cover. A collective.

    ``with_optimizer=False`` loads the weights only, leaving the optimizer as built (no state)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict, set_state_dict
    if not with_optimizer:
        state = {"model": get_model_state_dict(model.parts[0])}
        dcp.load(state, checkpoint_id=folder)
        set_model_state_dict(model.parts[0], state["model"])
        return
    state = checkpoint_state(model)
    dcp.load(state, checkpoint_id=folder)          # in place, into the tensors state holds
    set_state_dict(model.parts[0], model.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=checkpoint_options())


def gathered_parameters(modules) -> dict[str, torch.Tensor]:
    """Name -> full parameter, DTensor shards (FSDP, TP) gathered. A collective: call on every rank."""
    # Gathering a parameter sharded by both FSDP and TP takes two all-gathers; torch logs a
    # warning that one would be faster. Correct either way, and done once per run here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    out = {}
    for module in modules:
        for name, p in module.named_parameters():
            out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    return out


class AxisCount(TorchDispatchMode):
    """Collectives and point-to-point ops that really ran, per mesh axis: count and payload bytes.

    A dispatch mode sees every op after DTensor has turned it into plain ops and collectives
    (FSDP's all-gathers, the tensor-parallel all-gathers and reduce-scatters, the pipeline's
    sends), and each carries its process group, which names the axis. The payload is the bytes
    of the tensor a rank hands to the op (for an all-gather its shard, for a reduce-scatter
    the full input, for a send the tensor sent)::

        with AxisCount(mesh) as counted:     # AxisCount(mesh, also={"dp_cp": flat}) names a flattened submesh too
            model.train_step(x, y)
        counted.ops      # Counter: (axis, op) -> times;  counted.bytes: (axis, op) -> payload bytes
        counted.spans    # (axis, op, start, end) in time.perf_counter() seconds, waits included

    The spans time the calls (an asynchronous collective's transfer shows in its ``wait_tensor``),
    for drawing a timeline.
    """

    SKIP = {"wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier"}

    def __init__(self, mesh, also=None):
        super().__init__()
        self.axis_of = {mesh[a].get_group().group_name: a for a in mesh.mesh_dim_names}
        for name, submesh in (also or {}).items():   # e.g. {"dp_cp": a flattened ("dp", "cp") submesh}
            self.axis_of[submesh.get_group().group_name] = name
        self.ops, self.bytes = Counter(), Counter()
        self.spans: list[tuple[str, str, float, float]] = []

    def _group_and_payload(self, args):
        import torch.distributed as dist
        axis, payload = "other", 0
        for a in args:
            if isinstance(a, str) and a in self.axis_of:               # functional collectives: group name
                axis = self.axis_of[a]
            elif type(a).__name__ == "ScriptObject" and "ProcessGroup" in str(a._type()):
                axis = self.axis_of.get(dist.ProcessGroup.unbox(a).group_name, "other")   # c10d ops
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        lists = [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        return axis, tensors, lists

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented          # let DTensor turn the op into local ops and collectives first
        if func.namespace not in ("c10d", "_c10d_functional"):
            return func(*args, **(kwargs or {}))
        op = func._schema.name.split("::")[-1]
        axis, tensors, lists = self._group_and_payload(args)
        if op not in self.SKIP:
            self.ops[(axis, op)] += 1
            self.bytes[(axis, op)] += _payload(op, tensors, lists)
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.spans.append((axis if op not in self.SKIP else "wait", op, start, time.perf_counter()))
        return out

    def table(self) -> dict[str, tuple[int, int]]:
        """"axis op" -> (times, payload bytes), sorted."""
        return {f"{axis} {op}": (n, self.bytes[(axis, op)]) for (axis, op), n in sorted(self.ops.items())}


def _payload(op: str, tensors, lists) -> int:
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    if op == "_allgather_base_":           # (output, input, group, ...): a rank contributes its input
        return nbytes(tensors[1])
    if op == "_reduce_scatter_base_":      # (output, input, ...): a rank contributes the full input
        return nbytes(tensors[1])
    if op in ("send", "recv_", "allreduce_", "broadcast_"):
        return sum(nbytes(t) for t in lists)
    if tensors:                            # functional ops: the first tensor is the input
        return nbytes(tensors[0])
    return sum(nbytes(t) for t in lists)


def tp_local_parameters(config: GPTConfig, tp: int) -> dict[str, int]:
    """Elements of each kind of parameter group that one tensor-parallel rank holds.

    Column-wise q/k/v/up and row-wise o/down split their weights (and up's bias) over tp;
    the embeddings and the head split the vocabulary or positions; norms and down's bias are
    replicated."""
    D, V, S = config.width, config.vocab, config.context
    block = 4 * D + (4 * D * D + 4 * D * D + 4 * D + 4 * D * D) // tp + D
    return {"block": block, "embeddings": (V * D + S * D) // tp, "head": V * D // tp, "final norm": 2 * D}


def parameter_count(config: GPTConfig) -> int:
    """Parameters of the whole model: every block, the embeddings, the final norm and the head."""
    parts = tp_local_parameters(config, 1)
    return config.layers * parts["block"] + parts["embeddings"] + parts["head"] + parts["final norm"]


def communication_per_step(config: GPTConfig, dp: int, pp: int, tp: int, n_microbatches: int,
                           batch_size: int, stage: int, element_size: int = 8, *, stages_per_rank: int = 1,
                           loss_parallel: bool = False) -> dict[tuple[str, str], tuple[int, int]]:
    """(axis, op) -> (times, payload bytes) the rank at pipeline coordinate ``stage`` runs in one
    training step (``element_size`` 8 for float64), as AxisCount records them.

    With ``stages_per_rank`` > 1 (interleaved schedules) the rank holds stages stage, stage + pp, ...
    of pp * stages_per_rank, and its counts are the sum over them. ``loss_parallel``: the head's
    logits stay vocabulary-sharded and ``loss_parallel()`` computes the loss from the shards.
    Derived in chapter 11, section 5, and checked there against the counted ops of every layout."""
    n_stages = pp * stages_per_rank
    m = n_microbatches if n_stages > 1 else 1
    out: Counter = Counter()
    for s in range(stage, n_stages, pp):
        for key, (n, payload) in _stage_communication(config, dp, tp, m, batch_size, s, n_stages, element_size,
                                                      loss_parallel).items():
            out[key] = tuple(a + b for a, b in zip(out.get(key, (0, 0)), (n, payload)))
    return dict(out)


def _stage_communication(config, dp, tp, m, batch_size, stage, n_stages, f8, loss_parallel):
    L, D, V, S = config.layers // n_stages, config.width, config.vocab, config.context
    first, last = stage == 0, stage == n_stages - 1
    gathers_logits = last and not loss_parallel
    rows = batch_size // (dp * m)                       # rows of one micro-batch on one rank
    out = {}
    if tp > 1:
        shard, full = rows * (S // tp) * D * f8, rows * S * D * f8
        # fwd: 2 per block, ln_f->head, logits; bwd: 2 per block, tok, pos
        gathers = 4 * L + 2 * first + last + gathers_logits
        gather_bytes = (4 * L + last) * shard + gathers_logits * rows * S * (V // tp) * f8 + first * (shard + (S // tp) * D * f8)
        scatters = 4 * L + 2 * first + last              # fwd: o, down, tok, pos; bwd: 2 per block, head input
        scatter_bytes = (4 * L + first + last) * full + first * S * D * f8   # pos embeds one row: (1, S, D)
        out[("tp", "all_gather_into_tensor")] = (m * gathers, m * gather_bytes)
        out[("tp", "reduce_scatter_tensor")] = (m * scatters, m * scatter_bytes)
        norms = 2 * L + last                              # each norm's weight and bias, reduced once a step
        # loss_parallel: per micro-batch, 3 all-reduces of one number per position (max, sum of exps, target's logit)
        losses = 3 * m * (last and loss_parallel)
        out[("tp", "all_reduce")] = (2 * norms + losses, 2 * norms * D * f8 + losses * rows * S * f8)
    if n_stages > 1:
        boundary = rows * (S // tp) * D * f8             # a micro-batch's activation (sequence-sharded under tp)
        for op in ("send", "recv_"):
            n = m * ((not last) + (not first))            # activations forward, their gradients back
            out[("pp", op)] = (n, n * boundary)
    if dp > 1:
        local = tp_local_parameters(config, tp)
        ends = first * local["embeddings"] + last * (local["head"] + local["final norm"])
        # FSDP gathers a stage's outer unit once a step (a middle stage's has no parameters of its
        # own: nothing to gather). A block is freed after each forward and, under a pipeline, kept
        # whole after a backward: gathered by the first forward and by each op that follows a
        # forward, m + 1 times in any schedule. Every unit's full gradients are reduce-scattered
        # once, after the last micro-batch.
        outer = first or last
        out[("dp", "_allgather_base_")] = (outer + L * (m + 1), (ends + (m + 1) * L * local["block"]) * f8 // dp)
        out[("dp", "_reduce_scatter_base_")] = (outer + L, (ends + L * local["block"]) * f8)
    return {key: value for key, value in out.items() if value[0]}


# Bytes a rank puts on the wire per byte of payload, for the ring algorithms of chapter 05
# (n ranks on the axis): an all-gather forwards n-1 shards, a reduce-scatter (n-1)/n of its
# input, an all-reduce twice that; a send sends its tensor once (its recv is the peer's send).
def wire_factor(op: str, n: int) -> float:
    if "gather" in op:
        return n - 1
    if "reduce_scatter" in op:
        return (n - 1) / n
    if "all_reduce" in op or "allreduce" in op:
        return 2 * (n - 1) / n
    return 1.0 if op == "send" else 0.0


def axis_bandwidths(dp: int, pp: int, tp: int, ranks_per_node: int, intra: float, inter: float) -> dict[str, float]:
    """Bytes/s of each axis when ranks are numbered node by node and the mesh is ("dp", "pp", "tp"):
    tp's ranks are neighbours, pp's are tp apart, dp's pp*tp apart. An axis is as fast as its
    slowest link: intra-node if all its ranks share a node, else the network."""
    span = {"tp": tp, "pp": pp * tp, "dp": dp * pp * tp}       # consecutive ranks one group covers
    size = {"dp": dp, "pp": pp, "tp": tp}
    return {a: (intra if span[a] <= ranks_per_node or size[a] == 1 else inter) for a in span}


def step_time_model(config: GPTConfig, dp: int, pp: int, tp: int, n_microbatches: int, batch_size: int, *,
                    flops_per_s: float, ranks_per_node: int, intra: float, inter: float,
                    element_size: int = 8) -> dict[str, float]:
    """Seconds of one training step by chapter 11's cost model: compute split over all ranks and
    stretched by the pipeline bubble, plus each axis's wire bytes over that axis's bandwidth
    (nothing overlapped; attention's own FLOPs and every call's latency left out: a rough estimate
    that ranks layouts, not a prediction)."""
    m = n_microbatches if pp > 1 else 1
    flops = 6 * parameter_count(config) * batch_size * config.context           # forward 2, backward 4 per parameter and token
    compute = flops / (dp * pp * tp) / flops_per_s * (m + pp - 1) / m
    bandwidth = axis_bandwidths(dp, pp, tp, ranks_per_node, intra, inter)
    size = {"dp": dp, "pp": pp, "tp": tp}
    comm = {"dp": 0.0, "pp": 0.0, "tp": 0.0}
    for stage in range(pp):                                    # the slowest stage sets the pace
        per_axis = {"dp": 0.0, "pp": 0.0, "tp": 0.0}
        for (axis, op), (_, payload) in communication_per_step(config, dp, pp, tp, m, batch_size, stage, element_size).items():
            per_axis[axis] += payload * wire_factor(op, size[axis]) / bandwidth[axis]
        comm = {a: max(comm[a], per_axis[a]) for a in comm}
    return {"compute": compute, **{f"{a} comm": t for a, t in comm.items()},
            "total": compute + sum(comm.values())}
