"""course_lib.model_parallel: the meter counts what autograd keeps; CommAudit counts chapter 09's communication."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from course_lib import launch
from course_lib.comm_audit import CommAudit
from course_lib.model_parallel import SavedTensorMeter, bubble_fraction


def _chapter_09_communication():
    # What chapter 09 counts: point-to-point between stages, and DTensor's functional all-reduce.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    partial = DTensor.from_local(torch.ones(4, 2), mesh, [Partial()])   # a partial sum on every rank
    tensor = torch.ones(8)
    with CommAudit() as audit:
        if dist.get_rank() == 0:
            dist.send(tensor, dst=1)
        else:
            dist.recv(tensor, src=0)
        partial.redistribute(mesh, [Replicate()]).to_local()
    return [(op.name, op.bytes) for op in audit.calls]


def test_audit_sees_sends_and_dtensor_all_reduce_with_their_bytes():
    calls = launch(_chapter_09_communication, world_size=2, timeout=60, show_output=False)
    assert calls == [[("send", 32), ("all_reduce", 32)], [("recv", 32), ("all_reduce", 32)]]


def _stack(n, width=16):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n)])


def test_meter_counts_activations_once_and_releases_them_in_backward():
    model, x = _stack(6), torch.randn(4, 16)
    activation = 4 * 16 * 4
    with SavedTensorMeter(model.parameters()) as meter:
        out = model(x)
        kept = meter.now_bytes
        out.sum().backward()
    assert kept == 7 * activation              # the input plus one output per layer, shared ones once
    assert meter.peak_bytes == kept and meter.now_bytes == 0


def test_meter_sees_checkpoint_segment_inputs_and_frees_them_as_backward_goes():
    model, x = _stack(16), torch.randn(4, 16)
    activation = 4 * 16 * 4
    meter, held, backward = SavedTensorMeter(model.parameters()), [], [False]
    for start in (0, 4, 8):                    # the first layer of each checkpointed segment
        model[start].register_forward_pre_hook(lambda *_: held.append(meter.now_bytes) if backward[0] else None)
    with meter:
        out = checkpoint_sequential(model, 4, x, use_reentrant=False)
        kept = meter.now_bytes
        backward[0] = True
        out.sum().backward()
    assert kept == (3 + 1 + 4) * activation    # three segment inputs + the last segment's input and 4 outputs
    assert held == [3 * activation, 2 * activation, 1 * activation]   # recomputing segments 2, 1, 0
    assert meter.peak_bytes == kept and meter.now_bytes == 0


def test_bubble_fraction():
    # Two ranks, makespan 4 (10 to 14): rank 0 busy 2, rank 1 busy 2: idle 4 of 8.
    spans = [[("forward", 0, 10.0, 11.0), ("backward", 0, 13.0, 14.0)], [("forward", 0, 11.0, 13.0)]]
    assert bubble_fraction(spans) == 0.5
