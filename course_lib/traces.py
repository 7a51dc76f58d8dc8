"""Per-rank profiler traces: load them, merge them into one timeline, draw them.

Defined in chapter 10 (debugging and profiling). Every rank runs ``torch.profiler`` and
writes its own Chrome trace (``prof.export_chrome_trace(path)``); the notebook then::

    from course_lib.traces import load_events, merge_traces, plot_traces

    events = [load_events(p) for p in paths]      # one list per rank, rank order
    merge_traces(paths, "merged.json")            # open in https://ui.perfetto.dev
    plot_traces(events, compute=("forward", "backward", "optimizer"))

An event is a dict with the trace's own keys (``name``, ``ts`` and ``dur`` in
microseconds, ``tid``, ``cat``). The ranks of one machine share one clock
(``ts`` is read from the same monotonic clock), so their events line up as they are;
traces from several machines would first be aligned on a common event such as the
end of a barrier.
"""

from __future__ import annotations

import json

__all__ = ["load_events", "merge_traces", "trace_spans", "plot_traces", "COMM_PREFIXES"]

# Names the profiler gives communication: gloo's own record ("gloo:all_reduce"),
# NCCL's kernels ("ncclDevKernel_AllReduce...") and the c10d op ("c10d::allreduce_").
COMM_PREFIXES = ("gloo:", "nccl", "c10d::")


def load_events(path) -> list[dict]:
    """The complete events (Chrome ``"ph": "X"``) of one rank's trace, in time order."""
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    return sorted(events, key=lambda e: e["ts"])


def merge_traces(paths, out_path) -> dict:
    """Write one Chrome trace in which rank r's events are process "rank r".

    Chrome's trace viewer and Perfetto draw one group of rows per process id, so
    giving every rank's events the pid ``r`` (and a name) puts all ranks, one above
    the other, on one time axis.
    """
    merged = []
    for rank, path in enumerate(paths):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)["traceEvents"]
        merged.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        merged.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        merged += [{**e, "pid": rank} for e in events if e.get("ph") != "M"]
    trace = {"traceEvents": merged, "displayTimeUnit": "ms"}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return trace


def trace_spans(events_per_rank, compute=("forward", "backward", "optimizer")):
    """Turn each rank's events into ``(kind, label, start_s, end_s)`` spans for plotting.

    ``compute``: names of ``record_function`` annotations drawn as computation (the
    kind is the name); events whose name starts with one of ``COMM_PREFIXES`` but not
    ``c10d::`` (the c10d op only enqueues the work; the backend's event is the
    transfer itself) are drawn as ``"comm"``. Times start at the earliest shown event
    over all ranks.
    """
    shown = []
    for events in events_per_rank:
        picked = []
        for e in events:
            name = e["name"]
            if name in compute:
                picked.append((name, name, e))
            elif name.startswith(COMM_PREFIXES) and not name.startswith("c10d::"):
                picked.append(("comm", name, e))
        shown.append(picked)
    starts = [e["ts"] for picked in shown for _, _, e in picked]
    origin = min(starts) if starts else 0.0
    return [[(kind, label, (e["ts"] - origin) / 1e6, (e["ts"] + e["dur"] - origin) / 1e6)
             for kind, label, e in picked] for picked in shown]


def plot_traces(events_per_rank, compute=("forward", "backward", "optimizer"), title=None, ax=None):
    """Draw every rank's computation (top lane) and communication (bottom lane)."""
    from .timeline import plot_timeline

    colours = {"optimizer": "#55A868", "step": "#55A868", "data": "#937860"}
    return plot_timeline(trace_spans(events_per_rank, compute), ax=ax, title=title, colours=colours)
