"""The process that owns an emulated cluster's network: run as ``python -m course_lib.confine.emulated_network``.

Introduced with chapter 13 (course_lib.emulated_cluster starts it and talks to it). It makes, in a user
namespace of its own (so an ordinary user may, and nothing on the machine changes):

    node 0's namespace            this process's namespace (the switch)           node 1's namespace
    lo: its ranks talk here       br0, a bridge                                   lo
    eth0 10.13.0.1/24 ==veth== sw0 --- br0 --- sw1 ==veth== eth0 10.13.0.2/24

Each node is a network namespace, held open by a small process (a "holder") that ranks join with
setns(2). Traffic between two ranks of one node stays on the node's loopback; traffic between nodes
crosses two veths and the bridge, and each veth's sending side may be shaped by the kernel's traffic
control (``htb``: a rate; ``netem``: a delay, where the kernel has it). No address here exists outside
these namespaces and none has a route out, so no packet can leave the machine. When this process
ends (its standard input closed, or its parent gone), the holders end, and the kernel removes the
namespaces with every veth, bridge and queue in them: nothing is left behind.

Protocol: one JSON object per line. Started with a JSON argument {"nodes": N}, it answers
{"holders": [pid, ...], "addresses": [...], "netem": bool}; then for each request line
{"shape": {"rate_mbit": r or null, "delay_ms": d or null, "nodes": [i, ...] or null}} or {"counters": true}
it answers {"ok": ...} or {"error": "..."}.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys

from .namespaces import CLONE_NEWNET, become_root_of_new_user_namespace, unshare

SUBNET = "10.13.0"
NODE_INTERFACE = "eth0"
_PR_SET_PDEATHSIG = 1
# Each node's TCP: no return to slow start after a pause, so that each step of a collective starts at the
# speed the last one reached. (Its congestion control is the machine's: a user namespace may not change it.)
NODE_SYSCTLS = {"ipv4/tcp_slow_start_after_idle": "0"}

# A holder: leaves for a network namespace of its own, brings its loopback up, says so, then waits
# until its standard input closes (the switch ended) or its parent dies.
_HOLDER = r"""
import ctypes, json, os, signal, subprocess, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
    sys.exit(2)
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
try:
    for name, value in json.loads(sys.argv[2]).items():
        with open("/proc/sys/net/" + name, "w") as f:
            f.write(value)
except OSError as exc:
    print(f"setting net.{name.replace('/', '.')}: {exc}", flush=True)
    sys.exit(3)
print("ready", flush=True)
sys.stdin.read()
"""


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or result.returncode}")


def _node_prefix(pid: int) -> tuple:
    """What runs a command in the network namespace that holder ``pid`` holds."""
    return ("nsenter", f"--net=/proc/{pid}/ns/net")


def _in_node(pid: int, *command: str) -> None:
    _run(*_node_prefix(pid), *command)


def _start_holder() -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HOLDER, str(os.getpid()), json.dumps(NODE_SYSCTLS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    said = holder.stdout.readline().strip()
    if said != "ready":
        raise RuntimeError(f"a node's namespace could not be made ({said or 'exit status %s' % holder.wait()})")
    return holder


def build(nodes: int) -> list[subprocess.Popen]:
    _run("ip", "link", "set", "lo", "up")
    _run("ip", "link", "add", "br0", "type", "bridge")
    _run("ip", "link", "set", "br0", "up")
    holders = []
    for node in range(nodes):
        holder = _start_holder()
        holders.append(holder)
        _run("ip", "link", "add", f"sw{node}", "type", "veth", "peer", "name", NODE_INTERFACE,
             "netns", f"/proc/{holder.pid}/ns/net")
        # One frame per packet (no segmentation offload): a queue that holds a few milliseconds of the rate
        # then counts frames, not 64 KiB bundles of them.
        _run("ip", "link", "set", f"sw{node}", "gso_max_size", "1500", "gso_max_segs", "1", "master", "br0", "up")
        _in_node(holder.pid, "ip", "addr", "add", f"{SUBNET}.{node + 1}/24", "dev", NODE_INTERFACE)
        _in_node(holder.pid, "ip", "link", "set", NODE_INTERFACE, "gso_max_size", "1500", "gso_max_segs", "1", "up")
    return holders


def _has_netem() -> bool:
    probe = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                           capture_output=True)
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return probe.returncode == 0


def _burst_bytes(rate_mbit: float) -> int:
    # A token bucket lets a full bucket through at once: a large one would send short messages at loopback's
    # speed, not the link's. The kernel's timer is a high-resolution one, so a bucket of about one frame (what
    # 100 us of the rate brings, at least 1600 bytes) reaches the rate.
    return max(1600, int(rate_mbit * 1e6 / 8 * 100e-6))


def _queue_bytes(rate_mbit: float) -> int:
    # Deep enough that the data is never dropped (TCP waits 200 ms or more to resend a lost tail, which would
    # show up as a link suddenly twice as slow); acknowledgements do not wait behind it (see below).
    return max(4 << 20, int(rate_mbit * 1e6 / 8 * 0.5))


def _shaping_commands(device: str, rate_mbit: float) -> list[list[str]]:
    """An htb queue on ``device``: data at ``rate_mbit``; packets under 128 bytes (TCP's acknowledgements,
    which a link used both ways would otherwise queue behind the other direction's data, as every ring
    does) in a class of their own that is not slowed. They are a few percent of the bytes."""
    burst = str(_burst_bytes(rate_mbit))
    return [
        ["tc", "qdisc", "add", "dev", device, "root", "handle", "1:", "htb", "default", "20"],
        ["tc", "class", "add", "dev", device, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit", "prio", "0"],
        ["tc", "class", "add", "dev", device, "parent", "1:", "classid", "1:20", "htb", "rate", f"{rate_mbit}mbit",
         "ceil", f"{rate_mbit}mbit", "burst", burst, "cburst", burst, "prio", "1"],
        ["tc", "qdisc", "add", "dev", device, "parent", "1:20", "bfifo", "limit", str(_queue_bytes(rate_mbit))],
        ["tc", "filter", "add", "dev", device, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
         "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10"],
    ]


def _delay_commands(device: str, rate_mbit, delay_ms) -> list[list[str]]:
    netem = ["tc", "qdisc", "add", "dev", device, "root", "netem", "delay", f"{delay_ms}ms"]
    return [netem + (["rate", f"{rate_mbit}mbit"] if rate_mbit else [])]


def shape(holders, rate_mbit=None, delay_ms=None, nodes=None) -> None:
    """Both directions of each node's link: the switch's side sends to the node, the node's side sends out."""
    for node in range(len(holders)) if nodes is None else nodes:
        pid = holders[node].pid
        for prefix, device in (((), f"sw{node}"), (_node_prefix(pid), NODE_INTERFACE)):
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", device, "root"], capture_output=True)
            if delay_ms:
                commands = _delay_commands(device, rate_mbit, delay_ms)
            elif rate_mbit:
                commands = _shaping_commands(device, rate_mbit)
            else:
                commands = []
            for command in commands:
                _run(*prefix, *command)


def counters(nodes: int) -> list[dict]:
    """Bytes each node sent into and received from the switch (the bridge's side of its link)."""
    shown = subprocess.run(["ip", "-s", "-j", "link", "show"], capture_output=True, text=True, check=True)
    by_name = {link["ifname"]: link["stats64"] for link in json.loads(shown.stdout)}
    # The switch's veth receives what the node sends, and sends what the node receives.
    return [{"sent": by_name[f"sw{n}"]["rx"]["bytes"], "received": by_name[f"sw{n}"]["tx"]["bytes"]}
            for n in range(nodes)]


def _answer(message: dict) -> None:
    print(json.dumps(message), flush=True)


def main() -> None:
    _die_with_parent()
    config = json.loads(sys.argv[1])
    nodes = int(config["nodes"])
    try:
        become_root_of_new_user_namespace(CLONE_NEWNET)
        holders = build(nodes)
        netem = _has_netem()
    except (OSError, RuntimeError) as exc:
        _answer({"error": str(exc)})
        return
    _answer({"holders": [h.pid for h in holders], "addresses": [f"{SUBNET}.{n + 1}" for n in range(nodes)],
             "interface": NODE_INTERFACE, "netem": netem})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "shape" in request:
                wanted = request["shape"]
                if wanted.get("delay_ms") and not netem:
                    raise RuntimeError("this kernel has no netem queue (sch_netem): a delay cannot be added; "
                                       "rates (htb) still can")
                shape(holders, wanted.get("rate_mbit"), wanted.get("delay_ms"), wanted.get("nodes"))
                _answer({"ok": True})
            elif "counters" in request:
                _answer({"ok": counters(nodes)})
            else:
                _answer({"error": f"unknown request {request!r}"})
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            _answer({"error": str(exc)})
    _end(holders)


def _end(holders) -> None:
    """Close each holder's standard input and wait for it: the namespaces are gone when this returns."""
    for holder in holders:
        holder.stdin.close()
    for holder in holders:
        try:
            holder.wait(timeout=5)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()


if __name__ == "__main__":
    main()
