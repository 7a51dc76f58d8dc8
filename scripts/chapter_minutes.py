"""Minutes per chapter, for the README's chapter table and the workshop agenda in docs/instructors.md.

Usage: .venv/bin/python scripts/chapter_minutes.py [--write]

A chapter's minutes are computed, not guessed:
* running: the seconds its lesson and its solution notebook took to run top to bottom, as
  scripts/execute_notebooks.py recorded them in docs/run_times.json the last time it stored them
  (on the machine it names: a learner's laptop with more cores runs them faster);
* reading: the words of the lesson's text cells at 238 words a minute, the mean silent reading rate
  for non-fiction in Brysbaert's 2019 review of 190 studies; the code cells are not counted, so this
  is a floor (reading code is slower).
Solving the exercises is not measured: the agenda says so.

Without --write, prints the minutes and checks that the README and the agenda are current (exit 1
if not); with --write, updates both.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_TIMES = REPO / "docs" / "run_times.json"
README = REPO / "README.md"
INSTRUCTORS = REPO / "docs" / "instructors.md"
WORDS_PER_MINUTE = 238
AGENDA_START, AGENDA_END = "<!-- agenda: scripts/chapter_minutes.py --write -->", "<!-- end of agenda -->"
# Day 3 holds what large runs do today (mixture of experts, scale, fault tolerance): the chapters of it that exist.
DAYS = {"day 1": ("00", "01", "02", "03", "04", "05"), "day 2": ("06", "07", "08", "09", "10", "11"),
        "day 3": ("12", "13", "14")}


def prose_words(notebook: Path) -> int:
    cells = json.loads(notebook.read_text())["cells"]
    return sum(len(re.findall(r"[A-Za-z0-9]+", "".join(cell["source"]))) for cell in cells
               if cell["cell_type"] == "markdown")


def run_seconds(notebook: Path, times: dict) -> float:
    key = notebook.relative_to(REPO).as_posix()
    if key not in times:
        raise SystemExit(f"{key} has no recorded run time: run .venv/bin/python scripts/execute_notebooks.py {key}")
    return times[key]["seconds"]


def chapter_minutes(times: dict) -> dict[str, dict[str, int]]:
    minutes = {}
    for lesson in sorted((REPO / "notebooks").glob("*.ipynb")):
        solution = REPO / "solutions" / lesson.name
        running = run_seconds(lesson, times) + (run_seconds(solution, times) if solution.exists() else 0)
        minutes[lesson.stem[:2]] = {"reading": math.ceil(prose_words(lesson) / WORDS_PER_MINUTE),
                                    "running": math.ceil(running / 60)}
    return minutes


def readme_with_minutes(text: str, minutes: dict) -> str:
    def row(match):
        number = match.group(1)
        m = minutes[number]
        return f"{match.group(0).rsplit('|', 2)[0]}| {m['reading'] + m['running']} |"
    return re.sub(r"^\| (\d\d) \| `\w+` \| .* \| [^|]+ \| [^|]* \|$", row, text, flags=re.M)


def agenda(minutes: dict, times: dict) -> str:
    machines = sorted({f"{t['cpu']}, {t['cores']} cores" for t in times.values()})
    lines = [AGENDA_START, "",
             "| | chapters | reading (min) | running (min) | together |", "|---|---|---|---|---|"]
    for day, planned in DAYS.items():
        chapters = [c for c in planned if c in minutes]
        if not chapters:
            continue
        reading = sum(minutes[c]["reading"] for c in chapters)
        running = sum(minutes[c]["running"] for c in chapters)
        consecutive = [int(c) for c in chapters] == list(range(int(chapters[0]), int(chapters[-1]) + 1))
        span = chapters[0] if len(chapters) == 1 else f"{chapters[0]}–{chapters[-1]}" if consecutive else ", ".join(chapters)
        lines.append(f"| {day} | {span} | {reading} | {running} | {reading + running} |")
    lines += ["", f"Reading: the lessons' text at {WORDS_PER_MINUTE} words a minute (code not counted, so a floor); "
              f"running: lesson and solution notebooks top to bottom on {'; '.join(machines)} "
              "(`docs/run_times.json`). Solving the exercises is not in these numbers: plan at least as long "
              "again for them.", AGENDA_END]
    return "\n".join(lines)


def instructors_with_agenda(text: str, minutes: dict, times: dict) -> str:
    start, end = text.index(AGENDA_START), text.index(AGENDA_END) + len(AGENDA_END)
    return text[:start] + agenda(minutes, times) + text[end:]


def main(argv: list[str]) -> int:
    times = json.loads(RUN_TIMES.read_text())  # read once: minutes and the agenda's machine line
    minutes = chapter_minutes(times)
    for number, m in minutes.items():
        print(f"{number}: reading {m['reading']} min, running {m['running']} min")
    readme, instructors = README.read_text(), INSTRUCTORS.read_text()
    wanted = readme_with_minutes(readme, minutes), instructors_with_agenda(instructors, minutes, times)
    if "--write" in argv:
        README.write_text(wanted[0])
        INSTRUCTORS.write_text(wanted[1])
        return 0
    stale = [path.name for path, now, new in ((README, readme, wanted[0]), (INSTRUCTORS, instructors, wanted[1]))
             if now != new]
    if stale:
        print(f"not current: {', '.join(stale)} (run .venv/bin/python scripts/chapter_minutes.py --write)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
