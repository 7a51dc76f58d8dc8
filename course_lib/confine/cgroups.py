"""cgroups for a group of processes: a limit on their tasks and memory, made by root (Linux).

Introduced with the graded exercises (chapter 01 on): the grader's sandbox (course_lib.grading.sandbox)
puts every process of a submission in cgroups of its own when the grader is root, where the kernel
counts threads and memory for the whole group, children and daemons included (``RLIMIT_NPROC`` does not
hold for root). Below both the launcher and the grader, beside ``apart`` and ``tcp_flows``, so that any
group of processes the course starts (a submission, an emulated machine) can be held the same way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path

__all__ = ["Cgroups", "cgroup_roots", "own_cgroup_v1"]


def cgroup_roots() -> dict[str, Path] | None:
    """Where a root grader can make the sandbox's cgroups: {"v2": root} or {"pids": .., "memory": ..}."""
    base = Path("/sys/fs/cgroup")
    controllers = base / "cgroup.controllers"
    if controllers.exists():
        names = controllers.read_text().split()
        if {"pids", "memory"} <= set(names) and os.access(base, os.W_OK):
            return {"v2": base}
        return None
    roots = {name: own_cgroup_v1(name) for name in ("pids", "memory")}
    if all(root is not None and os.access(root, os.W_OK) for root in roots.values()):
        return roots
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
