"""course_lib.model_parallel: the counter sees every route to a collective, the meter counts what autograd keeps."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

from course_lib import launch
from course_lib.model_parallel import CollectiveCounter, SavedTensorMeter, bubble_fraction


def _collectives_by_every_route():
    from torch.distributed import distributed_c10d

    tensor = torch.ones(8)
    with CollectiveCounter() as counter:
        dist.all_reduce(tensor)
        distributed_c10d.all_reduce(tensor)                                    # another module path
        dist.group.WORLD.allreduce([tensor]).wait()                            # the ProcessGroup object
        pieces = [torch.empty(8) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, tensor)
        if dist.get_rank() == 0:
            dist.send(tensor, dst=1)
        else:
            dist.recv(tensor, src=0)
    return counter.calls


def test_counter_sees_every_route_and_the_bytes():
    calls = launch(_collectives_by_every_route, world_size=2, timeout=60, show_output=False)
    assert calls[0] == [("all_reduce", 32)] * 3 + [("all_gather", 64), ("send", 32)]
    assert calls[1] == [("all_reduce", 32)] * 3 + [("all_gather", 64), ("recv", 32)]


def _functional_collective():
    import torch.distributed._functional_collectives as funcol

    with CollectiveCounter() as counter:
        funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD).wait()
    return counter.names()


def test_counter_sees_functional_collectives():
    assert launch(_functional_collective, world_size=2, timeout=60, show_output=False) == [["all_reduce"]] * 2


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


def test_meter_sees_checkpoint_segment_inputs():
    model, x = _stack(16), torch.randn(4, 16)
    with SavedTensorMeter(model.parameters()) as meter:
        out = checkpoint_sequential(model, 4, x, use_reentrant=False)
        kept = meter.now_bytes
    del out
    assert kept == (4 + 4) * 4 * 16 * 4        # three segment inputs + the last segment's input and 4 outputs


def test_bubble_fraction():
    # Two ranks, makespan 4 (10 to 14): rank 0 busy 2, rank 1 busy 2: idle 4 of 8.
    spans = [[("forward", 0, 10.0, 11.0), ("backward", 0, 13.0, 14.0)], [("forward", 0, 11.0, 13.0)]]
    assert bubble_fraction(spans) == 0.5
