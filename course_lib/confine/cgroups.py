"""cgroups for a group of processes: a limit on their tasks and memory, made by root (Linux).

Introduced with the graded exercises (chapter 01 on): the grader's sandbox (course_lib.grading.sandbox)
puts every process of a submission in cgroups of its own when the grader is root, where the kernel
counts threads and memory for the whole group, children and daemons included (``RLIMIT_NPROC`` does not
hold for root), and where the CPU controller is there, shares the CPU among the group as one (``cpu_sharing``). Below both the launcher and the grader, beside ``apart`` and ``tcp_flows``, so that any
group of processes the course starts (a submission, an emulated machine) can be held the same way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path

__all__ = ["Cgroups", "cgroup_roots", "own_cgroup_v1", "own_cgroup_v2", "cpu_sharing"]


def cgroup_roots() -> dict[str, Path] | None:
    """Where a root grader can make the sandbox's cgroups: {"v2": root} or {"pids": .., "memory": ..} (and
    "cpu" where that controller's hierarchy is writable too: cgroup v1)."""
    base = Path("/sys/fs/cgroup")
    controllers = base / "cgroup.controllers"
    if controllers.exists():
        names = controllers.read_text().split()
        if {"pids", "memory"} <= set(names) and os.access(base, os.W_OK):
            return {"v2": base}
        return None
    roots = {name: own_cgroup_v1(name) for name in ("pids", "memory")}
    if all(root is not None and os.access(root, os.W_OK) for root in roots.values()):
        cpu = own_cgroup_v1("cpu")
        return roots | ({"cpu": cpu} if cpu is not None and os.access(cpu, os.W_OK) else {})
    return None


def cpu_sharing(roots: dict[str, Path] | None) -> tuple[str | None, str]:
    """How the CPU is shared between groups of processes the course starts (a submission being graded),
    so that one that runs a hundred busy processes gets no more of it than one that runs one:
    ("cgroup", why), ("session", why) or (None, why not).

    - "cgroup": each group gets a CPU cgroup of its own at the default weight (root, with the CPU
      controller here): it weighs as much as any other cgroup or session beside it, whatever it runs.
    - "session": each group runs in a session of its own and may not start another (seccomp refuses
      setsid: course_lib.confine.apart); the kernel's autogroups then give every session one equal
      share. That holds only where autogroups are on and this process is in the CPU controller's root
      group (the kernel ignores autogroups inside any other CPU cgroup).
    """
    if roots and ("cpu" in roots or ("v2" in roots and "cpu" in _enabled_below(roots["v2"]))):
        return "cgroup", "each submission's processes share one CPU cgroup at the default weight"
    autogroups = _autogroups_on()
    if autogroups is None:
        return None, "this kernel has no autogroups (CONFIG_SCHED_AUTOGROUP) and no CPU cgroup can be made here"
    if not autogroups:
        return None, "the kernel's autogroups are off (sysctl kernel.sched_autogroup_enabled=0)"
    if not _in_cpu_root():
        return None, ("this process is in a CPU cgroup below the root, where the kernel ignores autogroups, "
                      "and it cannot make CPU cgroups of its own (not root)")
    return "session", "each submission runs in a session of its own (an autogroup) and cannot start another"


def _autogroups_on() -> bool | None:
    """Whether the kernel's autogroups are on (None: a kernel without them)."""
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return None


def _enabled_below(root: Path) -> list[str]:
    with contextlib.suppress(OSError):
        return (root / "cgroup.subtree_control").read_text().split()
    return []


def _in_cpu_root() -> bool:
    """Whether this process is in the root group of the CPU controller (v1: its hierarchy's root, or no
    such hierarchy; v2: a cgroup without a CPU weight, which only the root and groups without the
    controller lack)."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        own = own_cgroup_v2()
        return own is not None and not (own / "cpu.weight").exists()
    own = own_cgroup_v1("cpu")
    return own is None or (own / "release_agent").exists()  # only a hierarchy's root has release_agent


def own_cgroup_v2() -> Path | None:
    """The cgroup (v2, the unified hierarchy) this process is in."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, names, path = line.split(":", 2)
            if hierarchy == "0" and names == "":
                return Path("/sys/fs/cgroup") / path.lstrip("/")
    return None


def own_cgroup_v1(controller: str) -> Path | None:
    """The cgroup (v1) this process is in, for one controller."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if controller in names.split(","):
                mount = Path("/sys/fs/cgroup") / controller
                return mount / path.lstrip("/") if mount.is_dir() else None
    return None


class Cgroups:
    """One sandbox's cgroups: created before it starts, joined by its first process, removed after."""

    def __init__(self, roots: dict[str, Path], name: str, memory_bytes: int, processes: int):
        self.v2 = "v2" in roots
        self.dirs = [roots["v2"] / name] if self.v2 else [roots["pids"] / name, roots["memory"] / name]
        if not self.v2 and "cpu" in roots:
            self.dirs.append(roots["cpu"] / name)  # at the default weight: see cpu_sharing
        for folder in self.dirs:
            folder.mkdir()
        if self.v2:
            (self.dirs[0] / "pids.max").write_text(str(processes))
            (self.dirs[0] / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (self.dirs[0] / "memory.swap.max").write_text("0")
        else:
            (self.dirs[0] / "pids.max").write_text(str(processes))
            (self.dirs[1] / "memory.limit_in_bytes").write_text(str(memory_bytes))

    def join_command(self) -> str:
        """Shell lines that move the shell (soon bwrap, by exec) into the cgroups."""
        return "".join(f"echo $$ > {shlex.quote(str(folder / 'cgroup.procs'))} || exit 97\n" for folder in self.dirs)

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` is in every one of these cgroups (the join did not fail silently)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        return all(f"/{folder.name}\n" in lines for folder in self.dirs)

    def oom_killed(self) -> bool:
        with contextlib.suppress(OSError, ValueError):
            if self.v2:
                events = dict(line.split() for line in (self.dirs[0] / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0
            control = dict(line.split() for line in (self.dirs[1] / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)) > 0
        return False

    def remove(self) -> None:
        for folder in self.dirs:
            for _ in range(50):
                with contextlib.suppress(OSError):
                    folder.rmdir()
                if not folder.exists():
                    break
                time.sleep(0.1)  # the last processes are still being reaped
