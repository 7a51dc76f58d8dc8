"""Chapter 07's checks: the model every check of gradient accumulation trains, and what a rank returns as data.

Introduced with chapter 07's exercises (a clipped accumulation step, a token-normalised loss, an epoch of
accumulation), whose setup cell imports these names. They run inside a check's ranks too (the rank imports
this module, as its setup cell did): ``as_data`` turns what your function returned into plain data for the
judge.
"""

import contextlib

import torch
import torch.nn as nn


def make_model(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)).to(dtype)


def flat(tensors):
    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def as_data(value):
    # A returned number as plain data for the check (numpy and torch scalars become Python numbers).
    if type(value) in (bool, int, float) or value is None:
        return value
    if hasattr(value, "item"):
        with contextlib.suppress(Exception):
            return as_data(value.item())
    return repr(value)[:100]
