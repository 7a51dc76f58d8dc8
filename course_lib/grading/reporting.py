"""Reporting: what grading a class prints and writes (grading, step 4).

A progress line per graded notebook, a feedback file per student (each check passed, or why
not), the score table printed at the end and grades.csv with the same rows.

Every name in a class folder, and every message a learner's code raised, is a stranger's text. What
is written or printed shows it escaped where it could not be written as UTF-8 (a name whose bytes
are not UTF-8, a lone surrogate) or would break a line, and no cell of grades.csv starts like a
spreadsheet formula. Files are written beside their place and moved over it, never through a link.
"""

from __future__ import annotations

import contextlib
import csv
import heapq
import io
import os
import re
import sys
import tempfile
from pathlib import Path

from .scoring import NotebookResult

FEEDBACK_FILE = "feedback.txt"
LISTED_FILES = 20  # other notebooks a student's feedback names; past that, only how many more

# Python reads the bytes of a name that are not UTF-8 as the surrogates U+DC80..U+DCFF (os.fsdecode),
# and a learner's exception message may hold any lone surrogate: neither can be written as UTF-8.
SURROGATE = re.compile(r"[\ud800-\udfff]")
# Characters that end a line, move a terminal's cursor or reorder text (the bidirectional controls):
# in a name, they could fake a row of the table or hide what follows.
TERMINAL_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069"
CONTROL_IN_TEXT = re.compile(f"[{TERMINAL_CONTROLS}]")  # feedback.txt keeps its tabs and line breaks
CONTROL_IN_LINE = re.compile(rf"[\t\n{TERMINAL_CONTROLS}]")
# How a spreadsheet recognizes a formula (OWASP's list for CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def shown_surrogate(match: re.Match) -> str:
    code = ord(match[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def writable(text: str) -> str:
    """text as it can be written in UTF-8: a byte of a name that was not UTF-8 shown as \\xff, any
    other lone surrogate as \\ud800."""
    return SURROGATE.sub(shown_surrogate, text)


def escaped(match: re.Match) -> str:
    return ascii(match[0])[1:-1]  # \n, \x1b, \u202e


def one_line(text: str) -> str:
    """A stranger's name or message as one line of the table, a CSV cell or a warning: writable, and
    every character that would end the line or drive the terminal escaped."""
    return CONTROL_IN_LINE.sub(escaped, writable(str(text)))


def text_block(text: str) -> str:
    """Like one_line, for feedback.txt: its line breaks and tabs are kept."""
    return CONTROL_IN_TEXT.sub(escaped, writable(text))


def csv_cell(text: str) -> str:
    """One cell of grades.csv: one line, and text a spreadsheet would run as a formula (a student
    folder named =HYPERLINK(...)) gets a leading ' so that it is shown as text. The numbers we write
    are never negative, so they stay numbers."""
    text = one_line(text)
    return "'" + text if text.startswith(FORMULA_START) else text


def warn(message: str) -> None:
    print(f"warning: {one_line(message)}", file=sys.stderr, flush=True)


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
    where = f"{one_line(result.student)}/{one_line(result.name)}"
    print(f"  {where}: {one_line(status)} ({result.seconds:.1f} s{together})", flush=True)


def feedback_text(student: str, results: list[NotebookResult], ignored: list[str], more: int = 0) -> str:
    """A student's feedback: each notebook's points, each check passed or why not, and the other
    notebooks in the folder (``ignored``, and how many ``more`` were not named)."""
    earned = sum(r.earned for r in results)
    possible = sum(r.max_points for r in results)
    lines = [f"Feedback for {one_line(student)}: {points(earned)} of {points(possible)} points "
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
        lines.append(f"Not graded: {one_line(name)} (not one of the exercise notebooks)")
    if more:
        lines.append(f"... and {more} more files that are not exercise notebooks")
    return text_block("\n".join(lines).rstrip() + "\n")


def other_notebooks(folder: Path, names: list[str]) -> tuple[list[str], int]:
    """The first LISTED_FILES notebooks in folder that are not exercises, by name, and how many more:
    a folder of a million files gets a feedback of a few lines."""
    try:
        with os.scandir(folder) as entries:
            others = [entry.name for entry in entries if entry.name.endswith(".ipynb") and entry.name not in names]
    except OSError:  # an unreadable folder: its notebooks are reported as such already
        return [], 0
    listed = heapq.nsmallest(LISTED_FILES, others)
    return listed, len(others) - len(listed)


def write_feedback(submissions: Path, students: list[str], names: list[str], table: dict) -> None:
    """feedback.txt in each student's folder; it also names the notebooks that were not graded. Where
    one cannot be written, a warning names it, and every other student still gets theirs."""
    for student in students:
        path = submissions / student / FEEDBACK_FILE
        ignored, more = other_notebooks(path.parent, names)
        text = feedback_text(student, [table[student, n] for n in names], ignored, more)
        try:
            replace_file(path, text)
        except IsADirectoryError:
            warn(f"{path} is a folder, where the feedback goes: {student} got none (rename that folder and "
                 "grade again)")
        except OSError as exc:
            warn(f"{path} could not be written ({exc.strerror}): {student} got no feedback")


def replace_file(path: Path, text: str) -> None:
    """Write a new file beside ``path`` and move it over ``path``: a link a student left under that name
    is replaced, never followed (writing through it would overwrite whatever it points to). OSError
    when that fails (a folder in the way, say), with nothing left behind."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.")
    try:
        with open(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as f:
            f.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def confinement(table: dict, student: str, names: list[str]) -> str:
    return "sandboxed" if all(table[student, n].sandboxed for n in names) else "not sandboxed"


def print_table(students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    columns = [one_line(Path(name).stem) for name in names]
    header = ["student", *columns, "total", "percent", "grading"]
    total_max = sum(maxima.values())
    rows = [["(max)", *[points(maxima[n]) for n in names], points(total_max), "100.0", ""]]
    for student in students:
        earned = [table[student, n].earned for n in names]
        rows.append([one_line(student), *map(points, earned), points(sum(earned)), percent(sum(earned), total_max),
                     confinement(table, student, names)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))


def write_csv(path: Path, students: list[str], names: list[str], table: dict, maxima: dict) -> None:
    """grades.csv: a row per student, every cell safe to open in a spreadsheet, written beside ``path``
    and moved over it (never through a link). OSError when it cannot be written."""
    total_max = sum(maxima.values())
    rows = [["student", *[Path(n).stem for n in names], "total", "max", "percent", "grading"]]
    for student in students:
        earned = [table[student, n].earned for n in names]
        rows.append([student, *map(points, earned), points(sum(earned)), points(total_max),
                     percent(sum(earned), total_max), confinement(table, student, names)])
    out = io.StringIO()
    csv.writer(out).writerows([csv_cell(cell) for cell in row] for row in rows)
    replace_file(path, out.getvalue())
