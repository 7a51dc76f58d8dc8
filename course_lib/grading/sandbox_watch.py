"""What the judge reads of a sandbox from outside, and the watchdog that holds it to its limits (grading;
introduced with chapter 01's exercises).

The measurements a check's rules count (bytes on the sandbox's loopback, TCP connections per pair of
ranks, memory of every process in it, what its folders and sockets hold) and the watchdog thread that
ends a sandbox over its limits, as the ``WatchedFromOutside`` part of course_lib.grading.sandbox.Sandbox.
Nothing here runs inside the sandbox: the kernel's counts, read by the judge, cannot be changed by a rank.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from .sandbox_folders import files_on_its_own_device

__all__ = ["WatchedFromOutside"]


class WatchedFromOutside:
    """The measuring half of a Sandbox (which supplies processes_inside, _inside_pids, view_of,
    _writable_folders, end and the limits these read)."""

    def loopback_bytes(self) -> tuple[int, int] | None:
        """(bytes, packets) sent on the sandbox's own loopback so far: the kernel's count, which
        nothing inside can lower (no capabilities there)."""
        for pid in self.processes_inside()[1:]:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
                    name, _, counts = line.partition(":")
                    if name.strip() == "lo":
                        fields = counts.split()
                        return int(fields[8]), int(fields[9])
        return None

    def tcp_diag(self):
        """A socket that lists the TCP connections of the sandbox's network namespace with their byte
        counts (course_lib.confine.tcp_flows), made once, from its init process's namespace, and held
        by the judge only."""
        if self._diag is None:
            self._diag = self._namespace_diag()
        return self._diag

    def _namespace_diag(self):
        """A new sock_diag socket made in the sandbox's network namespace (from its init process's)."""
        from ..confine.tcp_flows import diag_socket

        init = [outside for outside, inside in self._inside_pids().items() if inside == 1]
        if not init:
            raise LookupError("the sandbox's init process is gone")
        return diag_socket(netns_of_pid=init[0])

    def bytes_in_files_since(self, since: float) -> int:
        """Bytes in the files of the sandbox's writable folders written since ``since`` (time.time())."""
        total = 0
        for folder in self._writable_folders():
            for path, stat in files_on_its_own_device(folder):
                if stat.st_mtime >= since - 1:
                    total += stat.st_size
        return total

    def tmpfs_usage(self) -> dict[str, tuple[int, int]]:
        """(bytes, files) that each of the sandbox's own folders (/tmp, /dev/shm) holds now: the tmpfs's
        own counts, read at once however many files there are."""
        usage = {}
        for inside in self.private_folders:
            with contextlib.suppress(OSError, LookupError):
                stat = os.statvfs(self.view_of(inside))
                usage[inside] = ((stat.f_blocks - stat.f_bfree) * stat.f_frsize, stat.f_files - stat.f_ffree)
        return usage

    def resident_bytes(self) -> dict[int, int]:
        """Resident memory of each process in the sandbox now (pid outside -> bytes)."""
        sizes = {}
        for pid in self.processes_inside():
            with contextlib.suppress(OSError, ValueError, IndexError):
                sizes[pid] = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return sizes

    def memory_outside_processes(self, processes=None) -> int:
        """Bytes the learner side holds in memory that no process's resident size shows: files in the
        sandbox's /tmp and /dev/shm (tmpfs: memory), and memory files (memfd_create) its processes hold
        open but have not mapped (``processes``: the sandbox's, if already listed). Where a rank could keep
        what a memory rule counts, out of its sight."""
        total = sum(used for used, _ in self.tmpfs_usage().values())
        seen = set()
        for pid in self.processes_inside() if processes is None else processes:
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                            stat = os.stat(f"/proc/{pid}/fd/{fd}")
                            if (stat.st_dev, stat.st_ino) not in seen:
                                seen.add((stat.st_dev, stat.st_ino))
                                total += stat.st_blocks * 512
        return total

    def private_bytes(self, pids) -> int:
        """Memory that processes ``pids`` hold of their own (private pages, from smaps_rollup).

        Not their resident size: a child just forked (say, a rank running a subprocess) shares
        every page with its parent until it writes, so its resident size is the parent's."""
        total = 0
        for pid in pids:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith(("Private_Clean:", "Private_Dirty:")):
                        total += int(line.split()[1]) * 1024
        return total

    def socket_bytes_held(self) -> int:
        """Kernel memory the sockets of the sandbox's network namespace hold now (course_lib.confine.socket_memory)."""
        from ..confine.socket_memory import socket_memory

        if self._watch_diag is None:
            self._watch_diag = self._namespace_diag()
        return sum(socket_memory(self._watch_diag).values())

    def _watch(self) -> None:
        """Without a cgroup (an ordinary user), the judge enforces the memory limit itself; and, always,
        how many files (and, with an older bwrap, bytes) the sandbox's own folders hold. A pass that
        fails is recorded and the next one runs: a watchdog that died would leave the limits unheld."""
        while not self.closed and self.pid is not None:
            try:
                if self._watch_once():
                    return
            except Exception as exc:  # noqa: BLE001 - recorded, and the watch goes on
                self.watch["errors"] += 1
                self.watch["last_error"] = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)

    def _watch_once(self) -> bool:
        """One look at the sandbox; True once it has been ended for what it holds."""
        self.watch["passes"] += 1
        for inside, (used, files) in self.tmpfs_usage().items():
            self.watch["most_files"] = max(self.watch["most_files"], files)
            if files > self.tmpfs_files or used > self.tmpfs_bytes:
                self.end(f"it kept {files} files ({used / 2**20:.0f} MiB) in {inside}, more than the "
                         f"{self.tmpfs_files} files ({self.tmpfs_bytes / 2**20:.0f} MiB) a submission may")
                return True
        in_sockets = self.socket_bytes_held()
        self.watch["most_socket_bytes"] = max(self.watch["most_socket_bytes"], in_sockets)
        if in_sockets > self.socket_bytes:
            self.end(f"its sockets held {in_sockets / 2**20:.0f} MiB of the kernel's memory (queues nobody read), "
                     f"more than the {self.socket_bytes / 2**20:.0f} MiB a submission may")
            return True
        if self.cgroups is None:
            total = sum(self.resident_bytes().values()) + in_sockets
            if total > self.memory_bytes:
                self.end(f"its processes used {total / 2**30:.1f} GiB of memory, more than the "
                         f"{self.memory_bytes / 2**30:g} GiB a submission may use")
                return True
        elif self.cgroups.oom_killed():
            self.ended_because = (f"its processes needed more than the {self.memory_bytes / 2**30:g} GiB "
                                  "of memory a submission may use")
        return False
