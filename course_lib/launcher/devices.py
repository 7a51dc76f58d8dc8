"""Small facts about this machine that a launch (and the preflight chapter) needs: the cores a
rank may use, the backend to choose, and each rank's device.

Introduced in chapter 00 (preflight): ``available_cpus``, ``threads_per_rank`` and ``rank_device``
(which every chapter after it uses to put tensors on a rank's GPU, or the CPU without one).
"""

from __future__ import annotations

import os

# Test-only (tests/test_devices.py), never for learners: COURSE_FAKE_DEVICE=meta makes rank_device()
# act as on a machine with one GPU, with the meta device standing in for it: a process alone on
# its node (the notebook kernel, a one-rank launch) gets `meta`, the ranks of a bigger launch the
# CPU. A tensor on rank_device() that meets one left on the CPU then fails as it would on the GPU
# ("... is not on the expected device ..."), on a machine without one. Nothing else changes:
# choose_backend still gives gloo, which cannot carry meta tensors.
_FAKE_DEVICE_VARIABLE = "COURSE_FAKE_DEVICE"
# Set in every rank of a launch: launch shows each rank all of the GPUs the notebook sees, so one
# visible GPU there is the notebook's, shared by every rank (a session that exported
# CUDA_VISIBLE_DEVICES=0), never a GPU of the rank's own.
_SEES_ALL_GPUS_VARIABLE = "COURSE_RANK_SEES_ALL_GPUS"


def real_cpus() -> int:
    """CPU cores this process may really run on (taskset, cgroups via affinity), whatever COURSE_CPUS says."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_cpus() -> int:
    """CPU cores this process may use (respects taskset, cgroups via affinity).

    ``COURSE_CPUS=8`` makes the course behave as on an 8-core machine (the test
    suite uses it so the many-core code paths run on a small CI machine too).
    """
    pretend = os.environ.get("COURSE_CPUS")
    if pretend:
        if not pretend.isdigit() or int(pretend) < 1:
            raise ValueError(f"COURSE_CPUS must be a positive whole number of cores, got {pretend!r}")
        return int(pretend)
    return real_cpus()


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads per rank so that N ranks together don't oversubscribe the cores."""
    return max(1, available_cpus() // world_size)


def choose_backend(world_size: int) -> str:
    """gloo for CPU tensors; with a GPU per rank, also NCCL for CUDA tensors.

    The per-device form ``"cpu:gloo,cuda:nccl"`` lets the same cell run on a laptop
    and on a GPU machine: chapters build CPU tensors, which an NCCL-only group rejects.
    """
    import torch.distributed as dist

    if _visible_gpus() >= world_size and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _visible_gpus() -> int:
    """The GPUs this process sees (0 without CUDA): what choose_backend, rank_gpu and a launch's
    placement line count."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_gpu():
    """This rank's GPU index, or None when the rank has no GPU of its own (the CPU and gloo).

    A launcher gives each rank its GPU in one of two ways: every rank sees all of the node's
    GPUs and takes ``cuda:LOCAL_RANK`` (``launch``, torchrun's default), or each rank sees only
    its own, as ``cuda:0`` (CUDA_VISIBLE_DEVICES set per rank: ``srun --gpus-per-task=1``,
    ``torchrun --virtual-local-rank``). The script ``write_torchrun_script`` writes applies the
    same rule (a test holds the two together). ``launch`` always shows every rank all of the
    notebook's GPUs, so in its ranks one visible GPU is shared (CUDA_VISIBLE_DEVICES=0 exported
    for the whole session): the ranks of a bigger launch stay on the CPU. Under torchrun the two
    look the same to a rank: there, export no single GPU for several processes on one node.
    """
    visible = _visible_gpus()
    if visible == 0:
        return None
    if visible >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")):  # all of the node's GPUs
        return int(os.environ.get("LOCAL_RANK", "0"))
    if visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES") and not os.environ.get(_SEES_ALL_GPUS_VARIABLE):
        return 0  # this rank's own GPU only
    return None  # fewer GPUs than ranks, all visible to all: the ranks would have to share them


def rank_device():
    """This rank's device: its own GPU (see ``rank_gpu``) when it has one, else the CPU.

    Chapters create tensors and models with ``.to(rank_device())`` so the same cell runs
    with gloo on a laptop and with NCCL on a GPU machine, under ``launch`` and under torchrun.
    """
    import torch

    stand_in = os.environ.get(_FAKE_DEVICE_VARIABLE)
    if stand_in:  # test-only: see _FAKE_DEVICE_VARIABLE
        alone = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) == 1
        return torch.device(stand_in) if alone else torch.device("cpu")
    gpu = rank_gpu()
    return torch.device("cpu") if gpu is None else torch.device("cuda", gpu)


def _placement_line(world_size: int, backend: str | None) -> str | None:
    """Where a launch's ranks run, in a line, on a machine with a GPU (None without one: every rank
    is on the CPU, as on a laptop). The same rule as rank_gpu(): a GPU per rank, or none."""
    gpus = _visible_gpus()
    if gpus == 0:
        return None
    ranks = f"{world_size} rank{'s' if world_size > 1 else ''}"
    if gpus >= world_size:
        places = "on cuda:0" if world_size == 1 else f"each on a GPU of its own (cuda:0 to cuda:{world_size - 1})"
        group = "CUDA tensors over NCCL, CPU tensors over gloo" if backend and "nccl" in backend else \
            f"the group is {backend or 'made by fn'}"
        return f"{ranks} {places}: {group}"
    return (f"{ranks} on the CPU (gloo): {gpus} GPU{'s' if gpus > 1 else ''} for {world_size} ranks, "
            "so no rank takes one (rank_device() is the CPU)")
