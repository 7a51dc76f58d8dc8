"""Chapter 02's checks: the small model and the batch every check of data parallelism by hand starts from.

Introduced with chapter 02's exercises (splitting a batch by speed, gathering outputs, reducing gradients),
whose setup cell imports these names. The checks build their models and batches with them in the judge,
and send them to the learner side as arguments.
"""

import torch
import torch.nn as nn


def make_mlp(seed=0, n_in=8, width=16, n_out=5):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, n_out))


def make_batch(batch_size, seed=1, n_in=8, n_out=5):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, n_in, generator=generator), torch.randint(0, n_out, (batch_size,), generator=generator)
