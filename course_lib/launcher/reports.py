"""What the notebook is told about a failed rank: its traceback and, when a launch hangs, where
every rank was; notebook cells named as IPython names them ("Cell In[7], line 3").

Introduced in chapter 00 (preflight); chapter 10 (debugging) reads ``WorkerTimeout.where``.
A rank sends plain frames (see worker.py); the parent fills in source lines and cell names here,
because it has the kernel's cell files, which a worker started from a server or by spawn does not.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import time
from dataclasses import dataclass, field

from .errors import LaunchError
from .output import _read_text
from .protocol import _STACK_SIGNAL


@dataclass
class RankWhereabouts:
    """Where one rank was when a launch timed out (see ``WorkerTimeout.where``)."""

    rank: int
    state: str  # "finished", "collective", "waiting", "computing", "starting", "unknown"
    collective: str | None = None  # e.g. "all_reduce" when state == "collective"
    frames: list[str] = field(default_factory=list)  # outermost first

    def summary(self) -> str:
        here = f" at {self.frames[-1]}" if self.frames else ""
        user = _innermost_user_frame(self.frames)
        called_from = f" (called from {user})" if user and user != (self.frames or [None])[-1] else ""
        return {
            "finished": f"rank {self.rank}: finished fn, waiting for the other ranks",
            "collective": f"rank {self.rank}: inside the collective {self.collective}{called_from}",
            "waiting": f"rank {self.rank}: waiting for an asynchronous send/recv or collective "
                       f"(work.wait()){here}",
            "computing": f"rank {self.rank}: in its own computation, not in any collective{here}",
            "starting": f"rank {self.rank}: still starting (had not entered fn){here}",
            "unknown": f"rank {self.rank}: no stack available",
        }[self.state]


class WorkerTimeout(LaunchError):
    """The launch ran past its timeout.

    ``stacks[rank]`` is each unfinished rank's Python stack (outermost first),
    ``where[rank]`` says whether it was inside a collective (and which), waiting
    on an asynchronous operation, or in its own computation, and ``finished`` is
    the set of ranks that had returned from fn.
    """

    def __init__(self, timeout, stacks, finished, world_size, phase="fn", waited_s=0.0):
        self.timeout = timeout
        self.waited_s = waited_s  # what the ranks waited for a CPU, not counted in the timeout
        self.stacks = stacks
        self.finished = finished
        self.phase = phase
        self.where = {rank: _classify(rank, stacks.get(rank), rank in finished, phase)
                      for rank in range(world_size)}
        if phase == "startup":
            head = (f"the ranks did not all start within {timeout:g} s "
                    f"({len(finished)} of {world_size} had entered fn).")
        else:
            head = f"timed out after {timeout:g} s with {len(finished)} of {world_size} ranks finished."
        # The cause first, then the evidence: a long report's useful line must not come last.
        lines = [head, _diagnosis(self.where, phase), "Where each rank was:"]
        for rank in range(world_size):
            lines.append(self.where[rank].summary())
            if rank not in finished:
                lines.extend(f"    {frame}" for frame in stacks.get(rank, ["(no stack available)"]))
        if waited_s >= 1:
            lines.append(f"The ranks also waited {waited_s:.0f} s for a CPU (ready to run, every core busy), which "
                         "the timeout does not count: this machine runs more processes than it has cores. On a "
                         "shared server (a class) raise timeout= or run fewer ranks; otherwise look for what "
                         "else is running.")
        super().__init__("\n".join(lines))


_COLLECTIVE_WRAPPERS = {"wrapper", "_wrapper", "inner", "__call__"}


def _innermost_user_frame(frames):
    for frame in reversed(frames or []):
        if frame.startswith(("Cell In[", "File ")):
            return frame
    return None


def _classify(rank, frames, finished, phase) -> RankWhereabouts:
    if finished:
        return RankWhereabouts(rank, "finished")
    if frames is None:
        return RankWhereabouts(rank, "unknown")
    if phase == "startup" and not any(f.startswith(("Cell In[", "File ")) for f in frames):
        return RankWhereabouts(rank, "starting", frames=frames)
    for frame in reversed(frames):  # innermost first
        match = re.match(r"torch/distributed/[\w/]+\.py in (\w+)$", frame)
        if match and match.group(1) not in _COLLECTIVE_WRAPPERS and not match.group(1).startswith("_"):
            return RankWhereabouts(rank, "collective", collective=match.group(1), frames=frames)
    if frames and ".wait(" in frames[-1]:
        return RankWhereabouts(rank, "waiting", frames=frames)
    return RankWhereabouts(rank, "computing", frames=frames)


def _diagnosis(where, phase) -> str:
    stuck = [w for w in where.values() if w.state not in ("finished",)]
    in_comm = [w for w in stuck if w.state in ("collective", "waiting")]
    computing = [w for w in stuck if w.state == "computing"]
    names = lambda ws: ", ".join(str(w.rank) for w in ws)  # noqa: E731
    if phase == "startup":
        return ("All ranks were stopped. A rank that never reaches fn is usually stuck in the rendezvous "
                "(init_process_group waits for every rank) or in a slow import; raise startup_timeout on "
                "a slow or busy machine.")
    if not in_comm:
        return ("All ranks were stopped. No rank was inside a collective: they were stuck (or just slow) in "
                "their own computation. Likely causes: the work needs more than the timeout (raise "
                "timeout=), an endless loop, or a deadlock in a thread pool (e.g. a worker forked with "
                "start_method='fork' after the notebook ran a multi-threaded op).")
    collectives = {w.collective for w in in_comm if w.state == "collective"}
    if computing or any(w.state == "finished" for w in where.values()):
        others = [w for w in where.values() if w.state != "collective" and w.state != "waiting"]
        return (f"All ranks were stopped. Rank(s) {names(in_comm)} wait in communication that rank(s) "
                f"{names(others)} never joined: every rank of the group must call each collective, in the "
                "same order.")
    if len(collectives) > 1:
        return (f"All ranks were stopped. The ranks are inside different collectives "
                f"({', '.join(sorted(collectives))}): they call collectives in different orders.")
    return ("All ranks were stopped. Every rank is inside communication but it never completes: a send "
            "without a matching recv, a collective called a different number of times per rank, or "
            "mismatched shapes (TORCH_DISTRIBUTED_DEBUG=DETAIL checks them).")


# --------------------------------------------------------------------------
# Naming notebook cells
# --------------------------------------------------------------------------
def _cell_number(path: str):
    """The execution count IPython gave the cell whose code lives in ``path`` (or None)."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        return shell.compile._filename_map.get(path) if shell is not None else None
    except Exception:  # noqa: BLE001 - no IPython, or another version of it
        return None


def _readable_path(path: str) -> str:
    """A notebook cell's code file as IPython names it ("Cell In[7]"), other paths unchanged."""
    number = _cell_number(path)
    return f"Cell In[{number}]" if number is not None else path


def _format_traceback(rank, frames, read_sources=True) -> str:
    """IPython's style for cells (`Cell In[7], line 3, in fn`), source lines from the kernel.

    A judged launch never reads files the worker names (read_sources=False)."""
    lines = [f"Traceback of rank {rank} (most recent call last):\n"]
    for filename, lineno, name, line in frames:
        if not line and read_sources:
            line = linecache.getline(filename, lineno).strip()
        readable = _readable_path(filename)
        where = readable if readable.startswith("Cell In[") else f'File "{readable}"'
        lines.append(f"  {where}, line {lineno}, in {name}\n")
        if line:
            lines.append(f"    {line}\n")
    return "".join(lines)


# --------------------------------------------------------------------------
# A hung rank's stack (faulthandler dumps it when the parent sends _STACK_SIGNAL)
# --------------------------------------------------------------------------
_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
# The launcher's own frames (this package), and the server's and the kernel's below them.
_HIDDEN_FRAMES = ("multiprocessing", os.path.join("course_lib", "launcher", ""), "<frozen ", "threading.py")


def _parse_stack(text: str, read_sources: bool = True) -> list[str] | None:
    """Turn a faulthandler dump into the main thread's frames, outermost first."""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    for block in blocks:
        if "_worker_main" not in block:
            continue  # not the main thread (e.g. the parent watchdog)
        frames = [match for match in map(_FRAME.match, block.splitlines()) if match]
        frames.reverse()
        # Keep only what runs inside fn (or, before fn starts, inside init_process_group):
        # the stack also shows the server's or the kernel's frames below ours.
        for entry_point in ("_call_user_function", "_worker_main"):
            entry = [i for i, frame in enumerate(frames) if frame["func"] == entry_point]
            if entry:
                frames = frames[entry[-1] + 1:]
                break
        return [_shown_frame(frame, read_sources) for frame in frames
                if not any(hidden in frame["file"] for hidden in _HIDDEN_FRAMES)]
    return None


def _shown_frame(frame, read_sources: bool) -> str:
    """One frame of a dump as the report shows it: a library's path from its package, a cell by its name."""
    path = frame["file"]
    if "site-packages" in path or "dist-packages" in path:
        library_path = re.split(r"[\\/](?:site|dist)-packages[\\/]", path)[-1]
        return f"{library_path} in {frame['func']}"
    readable = _readable_path(path)
    where = readable if readable.startswith("Cell In[") else f'File "{readable}"'
    entry = f'{where}, line {frame["line"]}, in {frame["func"]}'
    source = linecache.getline(path, int(frame["line"])).strip() if read_sources else ""
    return f"{entry}: {source}" if source else entry


def _collect_stacks(procs, pending, stack_paths, wait_s=5.0, read_sources=True) -> dict[int, list[str]]:
    if _STACK_SIGNAL is None:
        return {}
    for rank in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(procs[rank].pid, _STACK_SIGNAL)
    stacks: dict[int, list[str]] = {}
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(stacks) < len(pending):
        for rank in pending:
            if rank not in stacks:
                parsed = _parse_stack(_read_text(stack_paths[rank]), read_sources)
                if parsed is not None:
                    stacks[rank] = parsed
        time.sleep(0.05)
    return stacks
