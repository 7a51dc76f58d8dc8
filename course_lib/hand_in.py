"""Handing in the exercises: a learner's own act, into their own home.

Introduced with the class hub (docs/instructors.md, "Hand in and collect"). A learner runs

    python -m course_lib.hand_in          (or, in a notebook: from course_lib.hand_in import hand_in; hand_in())

(in a terminal of the class hub, ``python`` is the course's), 
when their exercises are ready. The exercise notebooks in ``~/exercises`` are copied, as they are
now, into ``~/handed-in`` (replacing what was handed in before), with a list of what was handed in,
when, and each file's SHA-256. The instructor collects ``~/handed-in`` of every learner, never the
exercises a learner is still working on. Nothing is written anywhere but the learner's own home, so
no learner can read another's hand-in (on the class hub a home is its owner's alone).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import sys
from pathlib import Path

__all__ = ["hand_in"]

RECEIPT = "HANDED_IN.txt"


def _notebooks(folder: Path) -> list[Path]:
    """The exercise notebooks in ``folder``: plain files only (a link is not the learner's work)."""
    if folder.is_symlink() or not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of exercise notebooks (it is missing, or a link): "
                         "hand in from the exercises/ folder the course gave you")
    found = sorted(path for path in folder.glob("*.ipynb") if path.is_file() and not path.is_symlink())
    if not found:
        raise ValueError(f"{folder} holds no exercise notebook (*.ipynb) to hand in")
    return found


def hand_in(exercises: str | os.PathLike = "~/exercises", handed_in: str | os.PathLike = "~/handed-in") -> Path:
    """Copy the exercise notebooks into ``handed_in`` (what was there before is replaced); the receipt's path."""
    source, target = Path(exercises).expanduser(), Path(handed_in).expanduser()
    notebooks = _notebooks(source)
    if target.is_symlink():
        raise ValueError(f"{target} is a link: remove it (rm {target}) and hand in again")
    staging = target.with_name(target.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    lines = [f"handed in {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} from {source}"]
    for notebook in notebooks:
        data = notebook.read_bytes()
        (staging / notebook.name).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {notebook.name}")
    (staging / RECEIPT).write_text("\n".join(lines) + "\n")
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target / RECEIPT


def main() -> int:
    try:
        receipt = hand_in(*sys.argv[1:3])
    except ValueError as problem:
        print(f"not handed in: {problem}", file=sys.stderr)
        return 1
    lines = receipt.read_text().splitlines()
    count = len(lines) - 1
    print(f"{lines[0]}: {count} notebook{'' if count == 1 else 's'}, in {receipt.parent} "
          "(hand in again to replace them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
