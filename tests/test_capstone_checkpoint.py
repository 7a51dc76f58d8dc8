"""course_lib.capstone's checkpoints (chapter 11, section 9): saved by a ParallelGPT under one dp x pp x tp
layout and loaded under another, training goes on as one process's; without Adam's state, or with each
stage's blocks numbered from 0, it does not."""

import os
import tempfile
import warnings

import pytest
import torch

from course_lib import launch
from course_lib.capstone import (GPTConfig, ParallelGPT, checkpoint_state, cross_entropy, gathered_parameters,
                                 load_checkpoint, make_gpt, save_checkpoint, training_batch)

CONFIG = GPTConfig(width=32, layers=2)     # small: one block per stage on 2 stages
BATCH, LR, K, N = 8, 1e-2, 2, 2            # save after K steps, resume for N more
SAVED, RESUMED = (1, 2, 2), (2, 2, 1)      # 4 ranks each: stages split by tp, then the same stages by FSDP


def _mesh(layout):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", layout, mesh_dim_names=("dp", "pp", "tp"))


def _model(mesh, layout):
    return ParallelGPT(mesh, CONFIG, n_microbatches=max(2, layout[1]), lr=LR)


def _train_and_save(folders):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    mesh = _mesh(SAVED)
    model = _model(mesh, SAVED)
    losses = [model.train_step(*training_batch(step, BATCH, CONFIG.context)) for step in range(K)]
    save_checkpoint(model, folders["resumable"])
    part = model.parts[0]   # the blocks as a stage built from its own blocks would name them: from 0
    part.blocks = torch.nn.ModuleDict({str(i): block for i, block in enumerate(part.blocks.values())})
    dcp.save({"model": get_model_state_dict(part)}, checkpoint_id=folders["numbered from 0"])
    return {"coordinate": tuple(mesh.get_coordinate()), "losses": losses}


def _resume(folder):
    mesh = _mesh(RESUMED)
    coordinate = tuple(mesh.get_coordinate())
    out = {"coordinate": coordinate}
    for with_optimizer in (True, False):
        model = _model(mesh, RESUMED)
        load_checkpoint(model, folder, with_optimizer)
        losses = [model.train_step(*training_batch(step, BATCH, CONFIG.context)) for step in range(K, K + N)]
        params = gathered_parameters(model.parts)
        keep = coordinate[0] == 0 and coordinate[2] == 0                 # one copy of the weights per stage
        out[with_optimizer] = {"losses": losses, "params": params if keep else None}
    return out


def _one_process(steps):
    model = make_gpt(CONFIG)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        x, y = training_batch(step, BATCH, CONFIG.context)
        optimizer.zero_grad()
        loss = cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach() for name, p in model.named_parameters()}


def _step_losses(results):
    # Each step's loss: the mean over dp ranks of their last stage's, read on tp rank 0.
    last = [r for r in results if r["losses"][0] is not None and r["coordinate"][2] == 0]
    return [sum(losses) / len(last) for losses in zip(*(r["losses"] for r in last))]


@pytest.fixture(scope="module")
def runs():
    with tempfile.TemporaryDirectory() as work:
        folders = {name: os.path.join(work, name) for name in ("resumable", "numbered from 0")}
        saved = launch(_train_and_save, world_size=4, args=(folders,), timeout=120, show_output=False)
        files = sorted(os.listdir(folders["resumable"]))
        resumed = launch(_resume, world_size=4, args=(folders["resumable"],), timeout=120, show_output=False)
        whole = {"model": make_gpt(CONFIG).state_dict()}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            import torch.distributed.checkpoint as dcp
            try:
                dcp.load(whole, checkpoint_id=folders["numbered from 0"], no_dist=True)
                numbered_error = None
            except dcp.CheckpointException as error:
                numbered_error = str(error)
        yield {"saved": saved, "files": files, "resumed": resumed, "numbered from 0": numbered_error,
               "reference": _one_process(K + N)}
    assert not os.path.exists(work)


def _weight_gap(resumed, with_optimizer, reference):
    return max((p - reference[name]).abs().max().item()
               for r in resumed if r[with_optimizer]["params"] for name, p in r[with_optimizer]["params"].items())


def test_dcp_writes_one_file_per_rank_and_the_metadata(runs):
    assert runs["files"] == [".metadata"] + [f"__{rank}_0.distcp" for rank in range(4)]


def test_resumed_under_another_layout_training_goes_on_as_one_process(runs):
    losses, params = runs["reference"]
    assert max(abs(a - b) for a, b in zip(_step_losses(runs["saved"]), losses[:K])) < 1e-10
    resumed = [{"coordinate": r["coordinate"], **r[True]} for r in runs["resumed"]]
    assert max(abs(a - b) for a, b in zip(_step_losses(resumed), losses[K:])) < 1e-10
    assert sorted({n for r in runs["resumed"] if r[True]["params"] for n in r[True]["params"]}) == sorted(params)
    assert _weight_gap(runs["resumed"], True, params) < 1e-10


def test_without_adams_state_the_first_loss_agrees_and_the_run_then_leaves(runs):
    losses, params = runs["reference"]
    resumed = [{"coordinate": r["coordinate"], **r[False]} for r in runs["resumed"]]
    gaps = [abs(a - b) for a, b in zip(_step_losses(resumed), losses[K:])]
    assert gaps[0] < 1e-10              # computed from the loaded weights, before any update
    assert gaps[1] > 1e-6 and _weight_gap(runs["resumed"], False, params) > 1e-6


def test_stages_that_number_their_blocks_from_zero_leave_a_checkpoint_without_block_1(runs):
    assert runs["numbered from 0"] is not None
    assert "Missing key in checkpoint state_dict: model.blocks.1." in runs["numbered from 0"]


def _several_stages_per_rank():
    model = ParallelGPT(_mesh((1, 2, 1)), GPTConfig(width=32), n_microbatches=4, schedule="ScheduleInterleaved1F1B",
                        stages_per_rank=2)
    try:
        checkpoint_state(model)
    except ValueError as error:
        return str(error)
    return None


def test_checkpoint_state_takes_one_stage_per_rank():
    # One optimizer spans a rank's stages, and get_state_dict names its parameters through one module.
    errors = launch(_several_stages_per_rank, world_size=2, timeout=60, show_output=False)
    assert all(error is not None and "holds 2 stages" in error for error in errors), errors
