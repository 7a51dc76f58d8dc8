"""course_lib.emulated_cluster (chapter 13): nodes as network namespaces, links shaped by the kernel.

What must hold: a link runs at its set rate (within 15%, the fastest of three transfers) while ranks of one node are not slowed by it;
nothing (process, namespace, veth, queue) outlives a cluster, whether its launch succeeded or failed, or
its kernel was killed; an ordinary user can make one; bad input gets a clear error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from course_lib import WorkerError
from course_lib.emulated_cluster import EmulatedCluster, cluster_problem, node_bytes_sent
from course_lib.launcher import LaunchError

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(cluster_problem() is not None, reason=f"no emulated nodes here: {cluster_problem()}")


def _rate_and_loopback(size_bytes):
    import torch
    import torch.distributed as dist

    rank, tensor = dist.get_rank(), torch.ones(size_bytes // 4)
    out = {}
    for peer in (2, 1):  # rank 2: the other node; rank 1: the same node
        # The link caps the rate; a busy machine can only lower what a transfer shows (a rank not
        # scheduled in time stalls the stream), so the fastest of three transfers measures the link.
        tries = []
        for _ in range(3):
            dist.barrier()
            before = node_bytes_sent()
            start = time.perf_counter()
            if rank == 0:
                dist.send(tensor, peer)
                dist.recv(torch.empty(1), peer)
            elif rank == peer:
                dist.recv(tensor, 0)
                dist.send(torch.ones(1), 0)
            tries.append((time.perf_counter() - start, node_bytes_sent() - before))
        out[peer] = min(tries)
    return out


def test_a_link_runs_at_its_set_rate_and_the_nodes_own_loopback_is_not_slowed():
    with EmulatedCluster(nodes=2, ranks_per_node=2, rate_mbit=50) as cluster:
        results = cluster.launch(_rate_and_loopback, args=(2 << 20,), show_output=False, timeout=60)
    (seconds, wire), (local_seconds, local_wire) = results[0][2], results[0][1]
    rate = 50e6 / 8
    assert 0.85 * rate <= wire / seconds <= 1.15 * rate, f"{wire / seconds / 1e6:.2f} MB/s on a 6.25 MB/s link"
    assert local_seconds < 0.1 * seconds, f"inside the node {local_seconds:.3f} s, across {seconds:.3f} s"
    assert local_wire < 64 << 10, f"{local_wire} bytes left the node for a message inside it"


def _net_namespaces() -> set:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.add(os.readlink(entry / "ns" / "net"))
            except OSError:
                pass
    return found


def _host_links() -> list:
    shown = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    return sorted(link["ifname"] for link in json.loads(shown.stdout))


def _eventually(condition, within_s=10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _gone(pids, within_s=10.0) -> bool:
    return _eventually(lambda: not any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in pids),
                       within_s)


def _state(pid) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _fails_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("on purpose")
    dist.barrier()


def test_nothing_is_left_behind_by_a_cluster_whose_launch_failed():
    namespaces, links = _net_namespaces(), _host_links()
    cluster = EmulatedCluster(nodes=2, ranks_per_node=1, rate_mbit=100)
    pids = [cluster._switch.pid, *cluster.holders]
    assert len(_net_namespaces() - namespaces) == 3  # the switch's and one per node
    with pytest.raises(WorkerError, match="on purpose"):
        cluster.launch(_fails_on_rank_1, show_output=False, timeout=30)
    cluster.close()
    # close() returns once the switch has ended its holders and been reaped itself: nothing, not even a zombie
    assert [pid for pid in pids if Path(f"/proc/{pid}").exists()] == [], "the switch or a node's holder outlived close()"
    assert _net_namespaces() - namespaces == set(), "a network namespace outlived the cluster"
    assert _host_links() == links, "the cluster left a link on the machine"
    with pytest.raises(LaunchError, match="closed"):
        cluster.launch(_fails_on_rank_1)


def test_a_cluster_ends_with_the_process_that_made_it():
    namespaces = _net_namespaces()
    maker = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import json, time
        from course_lib.emulated_cluster import EmulatedCluster
        cluster = EmulatedCluster(nodes=2, rate_mbit=10)
        print(json.dumps([cluster._switch.pid, *cluster.holders]), flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    pids = json.loads(maker.stdout.readline())
    maker.send_signal(signal.SIGKILL)
    maker.wait()
    assert _gone(pids), "the cluster's processes outlived the kernel that made it"
    assert _gone_namespaces(namespaces)


def _gone_namespaces(before, within_s=10.0) -> bool:
    return _eventually(lambda: not _net_namespaces() - before, within_s)


def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="nodes must be a whole number"):
        EmulatedCluster(nodes=0)
    with pytest.raises(ValueError, match="ranks_per_node must be a whole number"):
        EmulatedCluster(nodes=2, ranks_per_node=1.5)
    with EmulatedCluster(nodes=2) as cluster:
        with pytest.raises(ValueError, match="rate_mbit must be positive"):
            cluster.set_links(rate_mbit=-5)
        if not cluster.has_netem:
            with pytest.raises(LaunchError, match="no netem"):
                cluster.set_links(rate_mbit=10, delay_ms=5)
        assert "unshaped" in cluster.shaping()


def test_node_bytes_sent_outside_a_cluster_says_where_it_works(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    with pytest.raises(RuntimeError, match="EmulatedCluster.launch"):
        node_bytes_sent()


def test_without_linux_namespaces_the_cluster_says_why(monkeypatch):
    from course_lib.confine import namespaces

    monkeypatch.setattr(namespaces.sys, "platform", "darwin")
    with pytest.raises(LaunchError, match="need Linux"):
        EmulatedCluster(nodes=2)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a command as another user: needs root")
def test_an_ordinary_user_makes_a_cluster_and_its_ranks_talk_across_it():
    folder = Path(tempfile.mkdtemp(prefix="cluster-ordinary-"))   # not pytest's tmp_path: its parents are private
    folder.chmod(0o755)
    script = folder / "ordinary.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch, torch.distributed as dist
        from course_lib.emulated_cluster import EmulatedCluster

        def node_and_sum():
            t = torch.ones(3) * dist.get_rank()
            dist.all_reduce(t)
            return os.environ["GROUP_RANK"], t.tolist()

        with EmulatedCluster(nodes=2, ranks_per_node=1, rate_mbit=100) as cluster:
            print(cluster.launch(node_and_sum, show_output=False))
    """))
    script.chmod(0o644)
    try:
        done = subprocess.run([sys.executable, str(REPO / "tests" / "ordinary_user.py"), sys.executable, str(script)],
                              capture_output=True, text=True, timeout=180, cwd="/tmp")
    finally:
        shutil.rmtree(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[('0', [1.0, 1.0, 1.0]), ('1', [1.0, 1.0, 1.0])]" in done.stdout, done.stdout + done.stderr
