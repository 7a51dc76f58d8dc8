"""Chapter 06's checks: the device autocast runs on, and the model every check of mixed precision trains there.

Introduced with chapter 06's exercises (a loss scaler, the smallest loss scale, a blockwise FP8 matmul),
whose setup cell imports these names. ``device`` is found when this module is first imported in a process:
in the judge's kernel, and in each learner-side process, which runs the setup cell first.
"""

import torch
import torch.nn as nn

from ..launcher import rank_device

device = rank_device()  # the checks use CUDA autocast on a GPU machine, CPU autocast elsewhere


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu().clone()
