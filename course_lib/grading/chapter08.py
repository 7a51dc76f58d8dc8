"""Chapter 08's checks: the model every check of ZeRO and FSDP trains, its flat and padded parameters, and
each rank's share of the training data.

Introduced with chapter 08's exercises (ZeRO-2, clipping sharded gradients, resharding FSDP2's checkpoint,
HSDP), whose setup cell imports these names; your answers use ``padded_flat`` and ``rank_batch``. On a rank,
``DIGITS`` is the dict the setup cell imported (this module's own), so the data a check puts there
(``__main__.DIGITS``) is what ``rank_batch`` reads.
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn

DIGITS = {}  # this rank's training data (X, y): a check hands each rank its own before it calls your function


def make_model(hidden=(32, 32), seed=0):
    torch.manual_seed(seed)
    sizes, layers = (64, *hidden, 10), []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def padded_flat(tensor, world_size):
    # The tensor flattened and padded with zeros to a multiple of world_size elements.
    size = math.ceil(tensor.numel() / world_size) * world_size
    out = torch.zeros(size, dtype=tensor.dtype)
    out[:tensor.numel()] = tensor.detach().reshape(-1)
    return out


def rank_batch(step, batch=48):
    # This rank's equal share of the global batch of step `step`. A check hands each rank only its own
    # shares of the digits (of steps 0, 1, ... one after another), never another rank's.
    X, y = DIGITS["X"], DIGITS["y"]
    per_rank = batch // dist.get_world_size()
    start = step * per_rank
    return X[start:start + per_rank], y[start:start + per_rank]
