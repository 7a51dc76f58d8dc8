"""A judged launch's measurements of each rank, read from outside it while every rank waits to be
released: bytes written and sent to the other ranks, peak and starting memory.

Not a chapter's: grading (course_lib.grading.judge) measures the learner's ranks this way, and
the checks' rules on bytes and memory read the numbers.
"""

from __future__ import annotations

import os
import sys
import time

from .errors import MeasurementRefused, WorkerError

_MEMORY_SAMPLE_SECONDS = 0.01
# Loopback counts whole frames: each packet adds 14 (link) + 20 (IPv4) + 20-60 (TCP) bytes of headers.
_FRAME_HEADER_BYTES = (14 + 20 + 8, 14 + 20 + 60)  # the least (UDP) and the most (TCP, all options)
_BYTES_SLACK = 64 << 10
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_bytes(pid) -> int:
    """A process's resident memory now (Linux), or 0."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


class _Meter:
    """What the kernel (and, in a sandbox, the sandbox) counted for each rank of one launch.

    The inbox (wait._Inbox) hands it each rank's baseline and result size; the waiter samples
    memory while the ranks run and calls ``measure_all`` once every rank has returned.
    """

    def __init__(self, procs, paths, judged=None, drains=(), loopback_before=None):
        self.procs, self.paths = procs, paths
        self.world_size = len(procs)
        self.sandbox = judged.sandbox if judged is not None else None
        self.counts_bytes = judged is not None and judged.counts_bytes
        self.memory_limit = judged.memory_limit if judged is not None else None
        self.drains = [list(drains[3 * r:3 * r + 3]) for r in range(len(procs))] if drains else None
        self.loopback_before = loopback_before
        self.started_at = time.time()
        self.baselines = {}  # rank -> bytes written before the learner's code ran
        self.start_rss = {}  # each rank's resident memory before any learner code ran
        self.drained_at_baseline = {}
        self.payload_bytes = {}
        self.sampled_rss = [0] * len(procs)  # the most resident memory seen from outside
        self.helper_peak = 0  # sandbox: the most memory that processes other than the ranks held at once
        self.stash_peak = 0  # sandbox: the most memory held in files (tmpfs, memfd) at once, beyond...
        self.stash_before = self.sandbox.memory_outside_processes() if self.sandbox is not None else 0  # ...this
        self.carried_at_least = None  # sandbox: the fewest bytes of data the loopback can have carried
        self._helpers_sampled = 0.0
        self._helpers_interval = 0.25  # longer when a pass is slow: see sample_memory

    def note_baseline(self, rank, written, resident) -> None:
        """A rank's baseline frame: what it had written, and held, before the learner's code ran."""
        self.baselines[rank] = written
        self.start_rss[rank] = resident or 0
        if self.drains is not None:
            self.drained_at_baseline[rank] = sum(drain.drained() for drain in self.drains[rank])

    def sample_memory(self, everything: bool = False):
        """The ranks' resident memory; in a sandbox, every 0.25 s (or now, with ``everything``), also what
        helpers and files hold. That pass reads every process in the sandbox, and a submission decides how
        many there are (a fork bomb left 900 sleeping: 0.3 s a pass), so the next one waits at least four
        times as long as the last took: the judge never spends more than a fifth of a core on it."""
        for rank in range(self.world_size):
            rss = _resident_bytes(self.procs[rank].pid)
            if rss > self.sampled_rss[rank]:
                self.sampled_rss[rank] = rss
        now = time.monotonic()
        if self.sandbox is not None and (everything or now - self._helpers_sampled > self._helpers_interval):
            # Not helpers: this launch's ranks, an earlier launch's ranks still exiting (their memory
            # is being freed), bwrap, its init and the launch server. A helper counts by the memory it
            # holds of its own: a rank's child between fork and exec shares all of the rank's pages.
            not_helpers = self.sandbox.rank_pids | self.sandbox.infrastructure_pids()
            inside = self.sandbox.processes_inside()
            helpers = self.sandbox.private_bytes(pid for pid in inside if pid not in not_helpers)
            self.helper_peak = max(self.helper_peak, helpers)
            self.stash_peak = max(self.stash_peak, self.sandbox.memory_outside_processes(inside) - self.stash_before)
            self._helpers_sampled = time.monotonic()
            self._helpers_interval = max(0.25, 4 * (self._helpers_sampled - now))

    def over_memory_limit(self):
        """(rank, bytes grown) of a rank whose memory, as sampled so far, has grown past the launch's
        limit, else None. Grown as ``measure`` counts it (helpers and files included), from samples that
        the final peak is never below: a launch stopped here would have failed the limit at its end."""
        if self.memory_limit is None:
            return None
        elsewhere = self.helper_peak + self.stash_peak
        for rank, start in sorted(self.start_rss.items()):
            grown = self.sampled_rss[rank] - start + elsewhere
            if start and grown > self.memory_limit:
                return rank, grown
        return None

    def measure_all(self) -> list:
        """Every rank measured at once, as all of them wait to be released (see measure)."""
        measurements = []
        self.sample_memory(everything=True)  # as they wait: what a rank keeps until it is released counts
        for rank in range(self.world_size):
            measured = self.measure(rank, self.payload_bytes.get(rank, 0))
            if measured is None and sys.platform.startswith("linux"):
                raise WorkerError(rank, "NotMeasured", "the rank's process could not be measured after it returned "
                                  "(did it exit before it was released?)", "", self.world_size)
            measurements.append(measured)
        if self.sandbox is not None and self.loopback_before is not None and self.counts_bytes:
            network = self._check_where_bytes_went(measurements)
            for measured in measurements:  # a total, the same for every rank
                measured["network_bytes"] = network
        if self.counts_bytes:
            on_the_wire = self._add_rank_flows(measurements)
            if on_the_wire is not None and self.carried_at_least is not None:
                self._check_every_byte_was_a_ranks(sum(on_the_wire))
        return measurements

    def _check_every_byte_was_a_ranks(self, sent_by_ranks: int) -> None:
        """What the ranks' open sockets sent must account for what the loopback carried. The rest was
        sent by a process that is not a rank (a helper it started, whose connections rank_flows does not
        credit to it) or over a connection closed before the ranks returned, which the socket table no
        longer lists: bytes that no rule on a rank's traffic would see."""
        unaccounted = self.carried_at_least - sent_by_ranks
        if unaccounted > _BYTES_SLACK:
            raise MeasurementRefused(
                f"{self.carried_at_least} bytes crossed the network between the sandbox's processes during the "
                f"launch, but the ranks' open connections sent {sent_by_ranks}: {unaccounted} went through a "
                "process that is not a rank (a helper it started) or a connection closed before the function "
                "returned (a process group destroyed in it: the launcher ends the group itself), which a rule on "
                "the ranks' traffic cannot see")

    def _add_rank_flows(self, measurements):
        """Sets each rank's ``sent_to`` and ``sent_to_others``; returns what each rank's sockets sent."""
        sent, to_others, on_the_wire = self._rank_flows()
        for rank, measured in enumerate(measurements):
            measured["sent_to"] = sent[rank] if sent is not None else None
            measured["sent_to_others"] = to_others[rank] if to_others is not None else None
            if sent is not None:  # what reached the other ranks, not what the process wrote (a file, /dev/null)
                # Not sent[rank][rank]: rank 0's own client talking to the TCPStore it hosts, 0.9 to
                # 3.5 KB that grow with how long it waits for the others, and reach no other rank.
                measured["sent_bytes"] = sum(n for peer, n in enumerate(sent[rank]) if peer != rank)
        return on_the_wire

    def _rank_flows(self):
        """Bytes per ordered pair of ranks over TCP, read from the kernel while every rank waits to be
        released (course_lib.confine.tcp_flows); Nones where that cannot be read (not Linux, or
        outside a sandbox where sock_diag is refused). In a sandbox, unreadable counts refuse the check."""
        if not sys.platform.startswith("linux"):
            return None, None, None
        from ..confine.tcp_flows import diag_socket, rank_flows

        pids = [proc.pid for proc in self.procs]
        if self.sandbox is None:  # a learner's own check, or --no-sandbox: a container may forbid sock_diag
            try:
                with diag_socket() as diag:
                    return rank_flows(diag, pids)
            except OSError:
                return None, None, None  # the check says the byte rule was skipped
        try:
            return rank_flows(self.sandbox.tcp_diag(), pids)
        except (OSError, LookupError) as exc:
            raise MeasurementRefused(f"the bytes between the ranks could not be read ({exc})") from None

    def _check_where_bytes_went(self, measurements) -> int:
        """Bytes the ranks wrote cannot be more than the sandbox's loopback carried, give or take headers:
        the rest went to /dev/null, a pipe or a local socket, not to a peer. (Less written than carried
        proves nothing: torch's TCPStore client sends with send(2), which the write count leaves out.)
        Returns what the loopback carried, headers taken off: the bytes that crossed the network between
        the sandbox's processes, which no file write or /dev/null can add to."""
        after = self.sandbox.loopback_bytes()
        if after is None or self.loopback_before is None:
            raise MeasurementRefused("the sandbox's loopback could not be read, so the bytes sent cannot be checked")
        frame_bytes, packets = after[0] - self.loopback_before[0], after[1] - self.loopback_before[1]
        most = frame_bytes - _FRAME_HEADER_BYTES[0] * packets
        self.carried_at_least = max(frame_bytes - _FRAME_HEADER_BYTES[1] * packets, 0)
        written = sum(m["written_bytes"] for m in measurements)
        in_files = self.sandbox.bytes_in_files_since(self.started_at)  # a checkpoint, say: written, not sent
        slack = _BYTES_SLACK + 0.03 * max(written, most)
        if written - in_files > most + slack:
            raise MeasurementRefused(
                f"the ranks wrote {written} bytes, {in_files} of them to files, but at most {max(most, 0)} crossed the "
                "network between them: the rest went to /dev/null, pipes or local sockets, which are not communication "
                "between ranks")
        return max(most, 0)

    def measure(self, rank, payload_bytes):
        """What the kernel counted for this rank, read while it waits to be released.

        ``sent_bytes``: bytes the process wrote (write/writev: gloo's TCP sends count here)
        since it reported its baseline (before the learner's code ran), minus what the launcher
        itself knows it wrote (the result, the output files). Where the check counts bytes and the
        kernel's socket table can be read, measure_all replaces it with the bytes that reached the
        other ranks over TCP (``sent_to`` summed over the other ranks), which no file or /dev/null write adds to.
        ``written_bytes``: what the process wrote, as ``sent_bytes`` before that (files and sockets
        alike: who wrote a checkpoint).
        ``peak_rss_bytes``: the process's peak resident memory: the larger of the kernel's
        high-water mark (VmHWM, which the process itself can reset through
        /proc/self/clear_refs) and the resident memory sampled from here every 10 ms.
        ``start_rss_bytes``: its resident memory before any learner code ran (what it shares with
        the launch server it was forked from, mostly): a rule on memory measures growth from it.
        Linux only (else None).
        """
        pid = self.procs[rank].pid
        try:
            with open(f"/proc/{pid}/io") as f:
                io_counts = dict(line.split(": ") for line in f.read().splitlines() if ": " in line)
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except (OSError, ValueError):
            return None
        own = payload_bytes + self._printed(rank) + (self.baselines.get(rank) or 0)  # baseline: before learner code
        self.sample_memory()
        peak = max(int(status.get("VmHWM", "0 kB").split()[0]) * 1024, self.sampled_rss[rank])
        # In a sandbox a rank's helpers count as its own: memory held by another process is still held;
        # and so does memory held in files (a tmpfs, a memfd), which no process's resident size shows.
        written = int(io_counts.get("wchar", 0)) - own
        return {"sent_bytes": written, "written_bytes": written,
                "peak_rss_bytes": peak + self.helper_peak + self.stash_peak,
                "start_rss_bytes": self.start_rss.get(rank, 0),
                "network_bytes": None,  # set by measure_all in a sandbox
                "sent_to": None, "sent_to_others": None}  # set by measure_all when the check counts bytes

    def _printed(self, rank) -> int:
        """What the rank printed (the launcher's own writes, not the learner's communication)."""
        if self.drains is not None:  # the pipes the judge drained: everything the rank printed
            return sum(drain.drained() for drain in self.drains[rank]) - self.drained_at_baseline.get(rank, 0)
        return sum(os.path.getsize(path) for kind in ("out", "err", "progress")
                   for path in [self.paths[kind][rank]] if os.path.exists(path))
