"""Out of memory: who the kernel's OOM killer should pick, whether it struck, and the limit that was hit.

Introduced with the class hub (jupyter/): a learner's server runs in a memory cgroup with a limit
(2 GiB by default), and every rank a notebook launches counts against it. When the ranks need more, the
kernel's out-of-memory killer ends one process of the group. Left to itself it picks the biggest, which
is often the notebook's kernel (it holds torch and the learner's tensors): the notebook goes silent and
the learner loses its state. So the ranks (and the launch server that forks them) ask to be picked first
(``prefer_as_victim``: a process may always raise its own ``oom_score_adj``), the kernel survives, and
the launcher reports a rank killed by SIGKILL while the machine's count of OOM kills rose as what it is:
out of memory, with the limit that was hit (``oom_kills``, ``memory_limit``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from .cgroups import own_cgroup_v1, own_cgroup_v2

__all__ = ["prefer_as_victim", "oom_kills", "memory_limit", "describe_limit", "RANK_OOM_SCORE_ADJ",
           "LAUNCH_SERVER_OOM_SCORE_ADJ"]

# Of -1000..1000, added to a process's share of the memory (1000: as if it held all of it). The ranks first,
# the biggest of them; then the server that forks them; the kernel (0) last, however much it holds.
RANK_OOM_SCORE_ADJ = 1000
LAUNCH_SERVER_OOM_SCORE_ADJ = 800


def prefer_as_victim(adjustment: int = RANK_OOM_SCORE_ADJ) -> None:
    """Make this process (and what it forks) the OOM killer's first choice over its parent."""
    with contextlib.suppress(OSError):
        path = Path("/proc/self/oom_score_adj")
        if int(path.read_text()) < adjustment:  # never lowered: that needs privileges, and it is not ours to do
            path.write_text(str(adjustment))


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has ended on this machine since boot (Linux 4.13 and later:
    ``oom_kill`` in /proc/vmstat counts both kinds, a cgroup's limit and the machine's memory), or None."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/vmstat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    return None


def memory_limit() -> int | None:
    """The smallest memory limit of this process's cgroup and those above it (bytes), or None without one."""
    limits = []
    for folder in _memory_cgroups():
        for name in ("memory.max", "memory.limit_in_bytes"):
            with contextlib.suppress(OSError, ValueError):
                text = (folder / name).read_text().strip()
                if text != "max" and int(text) < 1 << 60:  # v1 writes "no limit" as 2**63 rounded to a page
                    limits.append(int(text))
    return min(limits) if limits else None


def describe_limit() -> str:
    """A clause for a learner: the limit that was hit, when there is one."""
    limit = memory_limit()
    if limit is None:
        return "this machine ran out of memory"
    return f"this server's memory limit is {limit / 2**30:.1f} GiB, for the kernel and every rank together"


def _memory_cgroups() -> list[Path]:
    """This process's memory cgroup folder and every one above it, up to its hierarchy's root."""
    base = Path("/sys/fs/cgroup")
    unified = (base / "cgroup.controllers").exists()
    own, root = (own_cgroup_v2(), base) if unified else (own_cgroup_v1("memory"), base / "memory")
    if own is None:
        return []
    return [own, *(folder for folder in own.parents if folder == root or root in folder.parents)]
