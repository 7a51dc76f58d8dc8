"""Run the real DeepSpeed on CPU worker processes, quietly and without compiling anything.

Defined in chapter 08 (ZeRO and FSDP). Call these inside a worker started by ``launch``
(or ``torchrun``), before ``deepspeed.initialize``::

    from course_lib.deepspeed_cpu import deepspeed_missing, start_deepspeed_on_cpu

    reason = deepspeed_missing()          # None, or why DeepSpeed cannot run here
    def worker():
        deepspeed = start_deepspeed_on_cpu()   # joins the launcher's gloo group
        engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                       model_parameters=model.parameters())

What it does, and why:

* ``DS_ACCELERATOR=cpu`` (set before ``import deepspeed``): without it DeepSpeed probes
  for CUDA, XPU, HPU ... and picks the first it finds.
* DeepSpeed's ``init_distributed`` builds a C++ shared-memory all-reduce op when the
  accelerator is the CPU (``deepspeed/comm/torch.py``: ``build_shm_op``). That JIT build
  takes about 30 s the first time, needs a C++ compiler and ninja, and caches the result
  under ``~/.cache/torch_extensions/<python>_<cuda>/deepspeed_shm_comm``
  (``TORCH_EXTENSIONS_DIR`` moves it). The op serves only ``inference_all_reduce`` (an
  inference path); training's collectives go through ``torch.distributed``. So we mark it
  as not buildable in DeepSpeed's own table of compatible ops, which DeepSpeed consults
  before building, and nothing is compiled: no wait, and no compiler needed. Without the
  mark, on a machine with no C++ compiler, ``init_distributed`` fails with
  ``RuntimeError: Error building extension 'deepspeed_shm_comm'`` (and, without ninja,
  "Unable to JIT load the deepspeed_shm_comm op due to ninja not being installed");
  measured with DeepSpeed 0.19.8, where training then runs the same with the mark.
* ``low_precision_support()`` returns what DeepSpeed's accelerator answers about bf16 and
  fp16 on this machine. The CPU accelerator (``deepspeed/accelerator/cpu_accelerator.py``)
  answers ``True`` for bf16 always, and for fp16 ``True`` when oneDNN has fp16 kernels for
  the CPU (``torch.ops.mkldnn._is_mkldnn_fp16_supported()``), else ``None``.
* DeepSpeed logs every step's configuration to stdout at INFO level; a notebook whose
  output is compared with a stored copy needs only warnings and errors.
"""

from __future__ import annotations

import importlib.util
import logging
import os

__all__ = ["deepspeed_missing", "start_deepspeed_on_cpu", "low_precision_support", "SHM_OP"]

SHM_OP = "deepspeed_shm_comm"


def deepspeed_missing() -> str | None:
    """None when DeepSpeed is importable, else a sentence saying why not and how to fix it."""
    if importlib.util.find_spec("deepspeed") is None:
        return ("DeepSpeed is not installed in this environment: run `make setup` again, or "
                "`pip install -c constraints.txt deepspeed`")
    return None


def start_deepspeed_on_cpu():
    """Import DeepSpeed for the CPU, skip its inference-only C++ op, quieten its logs, join gloo.

    Returns the ``deepspeed`` module. The launcher has already initialised the default
    process group; DeepSpeed's ``init_distributed`` sees that and adopts it.
    """
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed
    import deepspeed.ops as ds_ops
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    # Reading the table runs DeepSpeed's compatibility probe once; the table is cached in
    # the module, and build_shm_op() returns None for an op marked False in it.
    ds_ops.__compatible_ops__[SHM_OP] = False
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def low_precision_support() -> dict:
    """DeepSpeed's accelerator on bf16 and fp16, next to the oneDNN probe its fp16 answer rests on.

    Call it where DeepSpeed has been imported for the CPU (after ``start_deepspeed_on_cpu``).
    """
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    return {"accelerator": accelerator.device_name(),
            "is_bf16_supported": accelerator.is_bf16_supported(),
            "is_fp16_supported": accelerator.is_fp16_supported(),
            "onednn_fp16": bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())}
