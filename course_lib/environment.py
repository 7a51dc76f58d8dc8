"""What this machine offers for distributed training (chapter 00, preflight).

Every function returns facts; the notebook decides what to say about them.
"""

from __future__ import annotations

import platform
import sys

import torch
import torch.distributed as dist

from .launcher import available_cpus

# The oldest torch on which every chapter was run and passes (docs/platforms.md, "Supported versions"): 2.14.1
# and 2.13 fail chapter 10's flight-recorder cells (gloo writes no dump before 2.15); 2.11 also 01,
# 04 and 11.
SUPPORTED_TORCH = (2, 15)


def torchvision_status() -> tuple[bool, str]:
    """(works, message): torchvision must import *and* run its compiled ops with this torch."""
    try:
        import torchvision
        from torchvision.ops import nms

        nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
    except Exception as exc:  # noqa: BLE001 - any failure here means "mismatched install"
        return False, (
            f"torchvision does not work with torch {torch.__version__}: {type(exc).__name__}: {exc}. "
            "Fix: install a matching pair in one command, e.g. `pip install -c constraints.txt torch torchvision` "
            "(CPU-only: add `--index-url https://download.pytorch.org/whl/cpu`)."
        )
    return True, f"torchvision {torchvision.__version__} works with torch {torch.__version__}"


def torch_version_ok() -> bool:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return (major, minor) >= SUPPORTED_TORCH


def backends() -> dict[str, bool]:
    """Which torch.distributed backends this build of torch has."""
    return {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available(),
        "mpi": dist.is_mpi_available(),
    }


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def recommended_world_size() -> int:
    """One rank per GPU when there are GPUs; else one per core, at least 2 and at most 4.

    Correctness never depends on it (every chapter's checks pass with 4 ranks on 2
    cores); speed measurements are only meaningful with at most one rank per core.
    """
    gpus = gpu_count()
    if gpus >= 2:
        return gpus
    return min(4, max(2, available_cpus()))


def describe() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
        "torch": torch.__version__,
        "cores": available_cpus(),
        "gpus": gpu_count(),
        "backends": backends(),
        "recommended world size": recommended_world_size(),
    }
