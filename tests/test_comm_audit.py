"""Tests of course_lib.comm_audit: every route to a built-in collective is caught, and a
hand-made ring of sends and receives shows sends and receives only, with their bytes."""

import pickle
import warnings

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.comm_audit import CommAudit, CommOp

N = 1000  # float32 elements: 4000 bytes


def _routes():
    """Every way a learner might reach a built-in all-reduce (or another collective)."""
    import torch.distributed as d  # an alias
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import all_reduce as renamed

    group = dist.group.WORLD
    t = torch.ones(N)
    routes = {
        "dist.all_reduce": lambda: dist.all_reduce(t),
        "alias": lambda: d.all_reduce(t),
        "renamed import": lambda: renamed(t),
        "distributed_c10d": lambda: dist.distributed_c10d.all_reduce(t),
        "async work": lambda: dist.all_reduce(t, async_op=True).wait(),
        "ProcessGroup.allreduce": lambda: group.allreduce([t]).wait(),
        "torch.ops.c10d.allreduce_": lambda: torch.ops.c10d.allreduce_(
            [t], group.boxed(), dist.ReduceOp(dist.ReduceOp.SUM).boxed(), None, False, -1)[1].wait(),
        "functional collectives": lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum", group)),
        "backend object": lambda: group._get_backend(torch.device("cpu")).allreduce([t]).wait(),
        "subgroup": lambda: dist.all_reduce(t, group=dist.new_group(list(range(dist.get_world_size())))),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(N // dist.get_world_size()), t),
    }
    if not hasattr(dist.ReduceOp, "boxed"):  # torch 2.11's ReduceOp cannot be handed to the op from Python
        del routes["torch.ops.c10d.allreduce_"]
    return routes


def _audit_every_route():
    results = {}
    for name, call in _routes().items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with CommAudit() as audit:
                call()
        results[name] = audit
    return results


def _hand_ring(n_steps):
    """A ring: each step sends a tensor to the right and receives one from the left."""
    rank, size = dist.get_rank(), dist.get_world_size()
    buf, incoming = torch.arange(N, dtype=torch.float32), torch.empty(N)
    with CommAudit() as audit:
        for _ in range(n_steps):
            send = dist.isend(buf, (rank + 1) % size)
            dist.recv(incoming, (rank - 1) % size)
            send.wait()
            buf += incoming
    return audit


def _audit_ddp_step():
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    with CommAudit() as audit:
        model(torch.randn(4, 8)).sum().backward()
    return audit


@pytest.fixture(scope="module")
def route_audits():
    return launch(_audit_every_route, world_size=2, timeout=120, show_output=False)


def test_plain_all_reduce_is_counted_once_with_its_bytes(route_audits):
    for audits in route_audits:
        audit = audits["dist.all_reduce"]
        assert audit.count("all_reduce") == 1, audit.summary()
        assert audit.calls == [CommOp("all_reduce", N * 4, None, "dispatcher")]


ROUTES = ["dist.all_reduce", "alias", "renamed import", "distributed_c10d", "async work",
          "ProcessGroup.allreduce", "torch.ops.c10d.allreduce_", "functional collectives",
          "backend object", "subgroup"]


@pytest.mark.parametrize("route", ROUTES)
def test_every_route_to_all_reduce_is_caught(route_audits, route):
    if route not in route_audits[0]:
        pytest.skip(f"{route}: this torch's ReduceOp has no boxed(), so Python cannot call the op directly")
    for audits in route_audits:
        audit = audits[route]
        assert audit.collectives() == ["all_reduce"], (route, audit.summary())
        assert audit.count("all_reduce") >= 1
        assert audit.sends == [] and audit.recvs == []


def test_the_backend_route_is_seen_through_the_profiler(route_audits):
    audit = route_audits[0]["backend object"]
    assert [op.layer for op in audit.calls] == ["backend"]
    assert audit.calls[0].bytes is None and audit.backend_work["all_reduce"] == 1


def test_reduce_scatter_is_named_as_such_not_as_gloos_all_reduces(route_audits):
    audit = route_audits[0]["reduce_scatter_tensor"]
    assert audit.collectives() == ["reduce_scatter_tensor"], audit.summary()
    assert audit.calls[0].bytes == N * 4


def test_a_hand_made_ring_shows_only_sends_and_receives():
    steps = 3
    audits = launch(_hand_ring, world_size=3, args=(steps,), timeout=60, show_output=False)
    for rank, audit in enumerate(audits):
        assert audit.collectives() == [], audit.summary()
        assert audit.count("send") == steps and audit.count("recv") == steps
        assert audit.bytes_sent == steps * N * 4 and audit.bytes_received == steps * N * 4
        assert {op.peer for op in audit.sends} == {(rank + 1) % 3}
        assert {op.peer for op in audit.recvs} == {(rank - 1) % 3}


def test_ddp_reducer_all_reduce_is_caught():
    for audit in launch(_audit_ddp_step, world_size=2, timeout=120, show_output=False):
        assert "all_reduce" in audit.collectives(), audit.summary()


def _nothing():
    with CommAudit() as audit:
        torch.ones(3).sum()
    return audit.summary()


def test_no_communication_and_the_audit_pickles():
    assert launch(_nothing, world_size=2, timeout=60, show_output=False) == [
        "no communication; sent 0 B, received 0 B"] * 2
    audit = CommAudit()
    audit.calls.append(CommOp("send", 8, 1))
    copy = pickle.loads(pickle.dumps(audit))
    assert copy.bytes_sent == 8 and copy.count("send") == 1


def _inside_a_profiler():
    with torch.profiler.profile():
        try:
            with CommAudit():
                pass
        except RuntimeError as exc:
            message = str(exc)
    with torch.profiler.profile():
        with CommAudit(backend_events=False) as audit:
            dist.all_reduce(torch.ones(2))
    return message, audit.collectives()


def test_inside_another_profiler_the_error_says_what_to_do():
    message, seen = launch(_inside_a_profiler, world_size=2, timeout=60, show_output=False)[0]
    assert "backend_events=False" in message
    assert seen == ["all_reduce"]


def _from_another_thread():
    import threading
    with CommAudit() as audit:
        worker = threading.Thread(target=dist.all_reduce, args=(torch.ones(2),))
        worker.start()
        worker.join()
    return audit.collectives()


def test_the_documented_limit_other_threads_are_not_seen():
    # The docstring promises the calling thread only; this keeps the promise honest.
    assert launch(_from_another_thread, world_size=2, timeout=60, show_output=False) == [[], []]


def test_a_worker_reading_the_calls_can_be_sent_by_value():
    import cloudpickle

    def worker():
        with CommAudit() as audit:
            torch.ones(1)
        return audit.calls

    assert cloudpickle.loads(cloudpickle.dumps(worker)) is not None
