"""Chapter 03's checks: their time limit, the model every check of DDP trains, and its parameters as one tensor.

Introduced with chapter 03's exercises (resuming training, the global loss, all-reduce hooks), whose setup
cell imports these names. ``make_model`` and ``flat`` also run inside a check's ranks (the rank imports
this module, as its setup cell did) and in your answers.
"""

import torch
import torch.nn as nn

CHECK_TIMEOUT = 60  # seconds: a deadlocked answer fails instead of hanging


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])
