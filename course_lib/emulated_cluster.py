"""A cluster on one machine: ranks grouped into emulated nodes, the links between nodes shaped.

Introduced in chapter 13 (chapter 05 runs its hierarchical all-reduces on it, chapter 10 its slow link). ``EmulatedCluster(nodes=2, ranks_per_node=2, rate_mbit=200)`` makes one
network namespace per node (course_lib.confine.emulated_network draws the picture): ranks of one node
talk over that node's loopback at full speed, ranks of different nodes over veth pairs and a bridge,
each link's sending side limited by the kernel's traffic control (an ``htb`` queue), and delayed by ``netem``
where the kernel has it. Real gloo traffic crosses real shaped links; nothing is a sleep in Python.
Linux only (user and network namespaces); an ordinary user may use it where the kernel allows
unprivileged user namespaces.

    with EmulatedCluster(nodes=2, ranks_per_node=2, rate_mbit=200) as cluster:
        results = cluster.launch(fn, args=(x,))      # like course_lib.launch: 4 ranks, 2 per node
        cluster.set_links(rate_mbit=50)                # slower links, same namespaces
        print(cluster.counters())                      # bytes each node sent and received
        # inside a rank: node_bytes_sent(), the bytes its node has sent so far
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .confine.namespaces import namespaces_problem
from .launcher import LaunchError
from .launcher.launching import _launch

__all__ = ["EmulatedCluster", "cluster_problem", "node_bytes_sent"]


def node_bytes_sent() -> int:
    """Inside a rank of an emulated cluster: bytes that have left this rank's node through its link so far,
    headers included, as the kernel counts them (read before and after something to count what it sent)."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "")
    shown = subprocess.run(["ip", "-s", "-j", "link", "show", "dev", interface], capture_output=True, text=True)
    if shown.returncode != 0 or not interface.startswith("eth"):
        raise RuntimeError("node_bytes_sent() counts an emulated node's link: call it in a rank that "
                           "EmulatedCluster.launch started")
    return json.loads(shown.stdout)[0]["stats64"]["tx"]["bytes"]


def cluster_problem() -> str | None:
    """Why emulated nodes cannot run here (not Linux, no user namespaces, no ip/tc/nsenter), or None."""
    problem = namespaces_problem()
    if problem:
        return problem
    import shutil

    missing = [tool for tool in ("ip", "tc", "nsenter") if shutil.which(tool) is None]
    if missing:
        return (f"emulated nodes need {', '.join(missing)} (the iproute2 and util-linux packages): "
                "install them with your distribution's package manager")
    return None


class EmulatedCluster:
    """``nodes`` emulated nodes of ``ranks_per_node`` ranks each; links of ``rate_mbit`` (None: unshaped)."""

    def __init__(self, nodes: int = 2, ranks_per_node: int = 1, rate_mbit: float | None = None,
                 delay_ms: float | None = None):
        self._switch = None
        for name, value in (("nodes", nodes), ("ranks_per_node", ranks_per_node)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number, at least 1; got {value!r}")
        problem = cluster_problem()
        if problem:
            raise LaunchError(problem)
        self.nodes, self.ranks_per_node = nodes, ranks_per_node
        self._switch = subprocess.Popen([sys.executable, "-m", "course_lib.confine.emulated_network",
                                         json.dumps({"nodes": nodes})],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._read()
        if "error" in ready:
            self.close()
            raise LaunchError(f"the emulated cluster could not be made: {ready['error']}")
        self.holders, self.addresses = ready["holders"], ready["addresses"]
        self.interface, self.has_netem = ready["interface"], ready["netem"]
        self.rate_mbit = self.delay_ms = None
        if rate_mbit or delay_ms:
            self.set_links(rate_mbit, delay_ms)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node  # ranks fill node 0 first, as torchrun numbers them

    def shaping(self) -> str:
        """What the links between nodes are, in words (every output that measures them says it)."""
        if not (self.rate_mbit or self.delay_ms):
            return "links between nodes unshaped (veth and bridge at memory speed)"
        parts = [f"{self.rate_mbit:g} Mbit/s each way (htb)"] if self.rate_mbit else []
        parts += [f"{self.delay_ms:g} ms added delay (netem)"] if self.delay_ms else []
        return "links between nodes: " + ", ".join(parts)

    def set_links(self, rate_mbit: float | None = None, delay_ms: float | None = None, nodes=None) -> None:
        """Shape every node's link (or those of ``nodes``), both ways; None and None: unshaped."""
        if rate_mbit is not None and not rate_mbit > 0:
            raise ValueError(f"rate_mbit must be positive (megabits per second) or None; got {rate_mbit!r}")
        if delay_ms and not self.has_netem:
            raise LaunchError("this kernel has no netem queue (sch_netem), so no delay can be added to a link; "
                              "rates still can (htb): pass rate_mbit only")
        self._ask({"shape": {"rate_mbit": rate_mbit, "delay_ms": delay_ms, "nodes": nodes}})
        if nodes is None:
            self.rate_mbit, self.delay_ms = rate_mbit, delay_ms

    def counters(self) -> list[dict]:
        """Per node, the bytes it has sent to and received from the other nodes (counted by the kernel)."""
        return self._ask({"counters": True})

    def launch(self, fn, args=(), kwargs=None, *, timeout: float = 120, threads: int | None = None,
               show_output: bool = True, live: bool = True, startup_timeout: float = 120):
        """Run fn on every rank of the cluster, as course_lib.launch does; results in rank order."""
        if self._switch is None:
            raise LaunchError("this emulated cluster is closed: make a new EmulatedCluster")
        nodes = [self._placement(rank) for rank in range(self.world_size)]
        results, _ = _launch(fn, self.world_size, args, kwargs, timeout=timeout, backend="gloo",
                             init_process_group=True, start_method=None,
                             threads=threads,
                             show_output=show_output, live=live, startup_timeout=startup_timeout, nodes=nodes)
        return results

    def _placement(self, rank: int) -> dict:
        node = self.node_of(rank)
        holder = self.holders[node]
        return dict(node=node, local_rank=rank % self.ranks_per_node, local_world_size=self.ranks_per_node,
                    user_namespace=f"/proc/{holder}/ns/user", net_namespace=f"/proc/{holder}/ns/net",
                    master_addr=self.addresses[0], interface=self.interface)

    def _read(self) -> dict:
        line = self._switch.stdout.readline()
        if not line:
            code = self._switch.wait()
            return {"error": f"the process that owns its network ended (exit status {code})"}
        return json.loads(line)

    def _ask(self, request: dict):
        if self._switch is None:
            raise LaunchError("this emulated cluster is closed: make a new EmulatedCluster")
        self._switch.stdin.write(json.dumps(request) + "\n")
        self._switch.stdin.flush()
        answer = self._read()
        if "error" in answer:
            raise LaunchError(answer["error"])
        return answer["ok"]

    def close(self) -> None:
        """End the switch: its holders end, and the kernel removes every namespace, veth and queue."""
        if self._switch is None:
            return
        switch, self._switch = self._switch, None
        switch.stdin.close()
        try:
            switch.wait(timeout=10)
        except subprocess.TimeoutExpired:
            switch.kill()
            switch.wait()
        switch.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def __repr__(self):
        state = "closed" if self._switch is None else self.shaping()
        return f"EmulatedCluster({self.nodes} nodes x {self.ranks_per_node} ranks; {state})"
