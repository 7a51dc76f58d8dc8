"""The table `make test` prints at its end: where the time went, by stage, by file and by test.

Usage: .venv/bin/python scripts/test_durations.py DURATIONS_FILE [--top N] [--chapters]

``--chapters`` prints only the per-chapter table, in Markdown, as docs/testing.md keeps it: each chapter's
CPU seconds in its browser run, its lesson under nbval (the replays) and its solution under nbval; the
grading of every chapter's test submissions is one grade.py run (as a class is graded), in a row of its own.

DURATIONS_FILE holds one JSON line per test (and one per pytest run, with "test": null), as
the repository's conftest.py writes them when COURSE_DURATIONS_FILE is set.
"""

from __future__ import annotations

import argparse
import json
import re
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


CHAPTER_KINDS = ("lesson in the browser", "lesson under nbval", "solution under nbval")
GRADING = re.compile(r"^tests/test_chapter_exercises\.py::")
_CHAPTER_OF = [  # (pattern on a test's id, what it runs of its chapter)
    (re.compile(r"^tests/test_browser\.py::test_lesson_runs_in_jupyterlab_as_stored\[(\d\d)_"), CHAPTER_KINDS[0]),
    (re.compile(r"^notebooks/(\d\d)_[^:]*\.ipynb::"), CHAPTER_KINDS[1]),
    (re.compile(r"^solutions/(\d\d)_[^:]*\.ipynb::"), CHAPTER_KINDS[2]),
]


def chapter_of(test: str) -> tuple[str, str] | None:
    """(chapter number, what of it) for a test that runs one chapter's notebook, else None."""
    for pattern, kind in _CHAPTER_OF:
        found = pattern.match(test)
        if found:
            return found.group(1), kind
    return None


def chapter_table(entries: list[dict]) -> str:
    """Each chapter's CPU seconds by what ran it, the total, and the rest of the suite, in Markdown."""
    cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall: dict[str, float] = defaultdict(float)
    rest_cpu = rest_wall = grading_cpu = grading_wall = 0.0
    for e in entries:
        if e["test"] is None:
            continue
        if GRADING.match(e["test"]):  # one grade.py run for the class: its cost lands on the first chapter's test
            grading_cpu, grading_wall = grading_cpu + cpu_of(e), grading_wall + e["seconds"]
            continue
        found = chapter_of(e["test"])
        if found is None:
            rest_cpu, rest_wall = rest_cpu + cpu_of(e), rest_wall + e["seconds"]
            continue
        cpu[found[0]][found[1]] += cpu_of(e)
        wall[found[0]] += e["seconds"]
    lines = ["| chapter | " + " | ".join(CHAPTER_KINDS) + " | CPU in all | wall in all |",
             "|---|" + "---:|" * (len(CHAPTER_KINDS) + 2)]
    for chapter in sorted(cpu):
        cells = [f"{cpu[chapter][kind]:.0f}" if kind in cpu[chapter] else "-" for kind in CHAPTER_KINDS]
        lines.append(f"| {chapter} | " + " | ".join(cells)
                     + f" | {sum(cpu[chapter].values()):.0f} | {wall[chapter]:.0f} |")
    blank = " | ".join("" for _ in CHAPTER_KINDS)
    lines.append(f"| grading every chapter's test submissions (one grade.py run) | {blank} | {grading_cpu:.0f} | "
                 f"{grading_wall:.0f} |")
    lines.append(f"| the rest (library, grader, sandbox, hub, Slurm, tools) | {blank} | {rest_cpu:.0f} | {rest_wall:.0f} |")
    return "\n".join(lines)


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
        lines += ["", "each chapter's CPU seconds (docs/testing.md keeps this table)", chapter_table(entries)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("durations", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--chapters", action="store_true", help="only the per-chapter table, in Markdown")
    options = parser.parse_args()
    if not options.durations.exists():
        print(f"no durations recorded ({options.durations} does not exist)")
        return
    entries = read(options.durations)
    print(chapter_table(entries) if options.chapters else table(entries, options.top))


if __name__ == "__main__":
    main()
