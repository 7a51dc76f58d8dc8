"""The table `make test` prints at its end: where the time went, by stage, by file and by test.

Usage: python scripts/test_durations.py DURATIONS_FILE [--top N]

DURATIONS_FILE holds one JSON line per test (and one per pytest run, with "test": null), as
the repository's conftest.py writes them when COURSE_DURATIONS_FILE is set.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def file_of(test: str) -> str:
    """The test module or notebook a test belongs to (each browser lesson and each chapter's
    grading is a test of its own, so they show in the list of single tests)."""
    return test.partition("::")[0]


def cpu_of(entry: dict) -> float:
    """The CPU seconds a test's processes used (0 where they were not counted)."""
    return entry.get("test_cpu_seconds", 0.0)


def minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min" if seconds >= 60 else f"{seconds:5.1f} s  "


def table(entries: list[dict], top: int) -> str:
    runs = [e for e in entries if e["test"] is None]
    tests = [e for e in entries if e["test"] is not None]
    lines = ["", "Where `make test` spent its time", "",
             "stage (one pytest run each)            wall        CPU time (cores busy on average)"
             "   whole machine's CPU time (cores busy)"]
    for run in runs:
        cpu = run.get("cpu_seconds") or 0.0
        busy = f"{minutes(cpu)} ({cpu / run['seconds']:.1f})" if cpu and run["seconds"] else "     -"
        machine = run.get("machine_cpu_seconds")
        machine = f"{minutes(machine)} ({machine / run['seconds']:.1f})" if machine and run["seconds"] else "     -"
        lines.append(f"  {run['stage']:<36} {minutes(run['seconds'])}  {busy}  {machine}  {run['outcome']}")
    lines.append(f"  {'all stages':<36} {minutes(sum(r['seconds'] for r in runs))}")
    by_file: dict[tuple[str, str], float] = defaultdict(float)
    cpu_by_file: dict[tuple[str, str], float] = defaultdict(float)
    for e in tests:
        by_file[e["stage"], file_of(e["test"])] += e["seconds"]
        cpu_by_file[e["stage"], file_of(e["test"])] += cpu_of(e)
    counted = any("test_cpu_seconds" in e for e in tests)
    if counted:
        lines += ["", f"CPU time the tests' processes used (each pytest worker's cgroup): "
                      f"{minutes(sum(cpu_by_file.values())).strip()}; each line below shows it after the wall time"]
    lines += ["", f"the {top} slowest test modules and notebooks (their tests summed)"]
    for (stage, name), seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        cpu = f"  {minutes(cpu_by_file[stage, name])} CPU" if counted else ""
        lines.append(f"  {minutes(seconds)}{cpu}  {name}  [{stage}]")
    lines += ["", f"the {top} slowest single tests or notebook cells"]
    for e in sorted(tests, key=lambda e: -e["seconds"])[:top]:
        cpu = f"  {minutes(cpu_of(e))} CPU" if counted else ""
        lines.append(f"  {minutes(e['seconds'])}{cpu}  {e['test']}  [{e['stage']}]")
    if counted:
        lines += ["", f"the {top} tests or notebook cells that used the most CPU"]
        for e in sorted(tests, key=lambda e: -cpu_of(e))[:top]:
            lines.append(f"  {minutes(cpu_of(e))} CPU  {minutes(e['seconds'])}  "
                         f"{e['test']}  [{e['stage']}]")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", type=Path)
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    if not options.durations.exists():
        print(f"no durations recorded ({options.durations} does not exist)")
        return
    print(table(read(options.durations), options.top))


if __name__ == "__main__":
    main()
