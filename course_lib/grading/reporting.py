"""Reporting: what grading a class prints and writes (grading, step 4).

A progress line per graded notebook, a feedback file per student (each check passed, or why
not), the score table printed at the end and grades.csv with the same rows.
"""

from __future__ import annotations

import csv
import os
import sys
import tempfile
from pathlib import Path

from .scoring import NotebookResult

FEEDBACK_FILE = "feedback.txt"


def points(value: float) -> str:
    return f"{value:g}"


def percent(earned: float, possible: float) -> str:
    return f"{100.0 * earned / possible:.1f}" if possible else "0.0"


def indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def report_progress(result: NotebookResult, no_sandbox: bool, shared: int = 1) -> None:
    """One notebook graded: its score (or why none), and how long it took."""
    result.sandboxed = not no_sandbox
    status = result.problem or f"{points(result.earned)}/{points(result.max_points)}"
    together = f", one judge for {shared} submissions" if shared > 1 else ""
    together += ", not sandboxed" if no_sandbox else ""
    print(f"  {result.student}/{result.name}: {status} ({result.seconds:.1f} s{together})", flush=True)


def feedback_text(student: str, results: list[NotebookResult], ignored: list[str]) -> str:
    earned = sum(r.earned for r in results)
    possible = sum(r.max_points for r in results)
    lines = [f"Feedback for {student}: {points(earned)} of {points(possible)} points "
             f"({percent(earned, possible)}%)", ""]
    for r in results:
        lines.append(f"{r.name}: {points(r.earned)} of {points(r.max_points)} points")
        if r.problem:
            lines.append(f"  {r.problem}")
        for c in r.checks:
            head = f"  [{points(c.earned)}/{points(c.check.points)}] {c.check.label}: "
            if c.message == "passed":
                lines.append(head + "passed")
            else:
                lines.append(head + "FAILED")
                lines.append(indent(c.message, "      "))
        for note in r.notes:
            lines.append(indent("note: " + note, "  "))
        lines.append("")
    for name in ignored:
        lines.append(f"Not graded: {name} (not one of the exercise notebooks)")
    return "\n".join(lines).rstrip() + "\n"


def write_feedback(submissions: Path, students: list[str], names: list[str], table: dict) -> None:
    """feedback.txt in each student's folder; it also names the notebooks that were not graded."""
    for student in students:
        folder = submissions / student
        ignored = sorted(p.name for p in folder.glob("*.ipynb") if p.name not in names)
        text = feedback_text(student, [table[student, n] for n in names], ignored)
        replace_file(folder / FEEDBACK_FILE, text)


def replace_file(path: Path, text: str) -> None:
    """Write a new file and move it over ``path``: a link a student left under that name is
    replaced, never followed (writing through it would overwrite whatever it points to)."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as f:
        f.write(text)
    try:
        os.chmod(f.name, 0o644)
        os.replace(f.name, path)
    except OSError as exc:
        os.unlink(f.name)
        print(f"warning: {path} could not be written ({exc.strerror}): is it a folder?", file=sys.stderr)


def confinement(table: dict, student: str, names: list[str]) -> str:
    return "sandboxed" if all(table[student, n].sandboxed for n in names) else "not sandboxed"


def print_table(students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    columns = [Path(name).stem for name in names]
    header = ["student", *columns, "total", "percent", "grading"]
    total_max = sum(maxima.values())
    rows = [["(max)", *[points(maxima[n]) for n in names], points(total_max), "100.0", ""]]
    for student in students:
        earned = [table[student, n].earned for n in names]
        rows.append([student, *map(points, earned), points(sum(earned)), percent(sum(earned), total_max),
                     confinement(table, student, names)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


def write_csv(path: Path, students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    total_max = sum(maxima.values())
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *[Path(n).stem for n in names], "total", "max", "percent", "grading"])
        for student in students:
            earned = [table[student, n].earned for n in names]
            writer.writerow([student, *map(points, earned), points(sum(earned)), points(total_max),
                             percent(sum(earned), total_max), confinement(table, student, names)])
