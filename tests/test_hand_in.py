"""Handing in (course_lib/hand_in.py): a copy of the exercise notebooks as they are, into the learner's own
home, replacing the last hand-in, with a receipt; links and empty folders refused with what to do."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from course_lib.hand_in import RECEIPT, hand_in


def _exercises(home, *names):
    folder = home / "exercises"
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_text(f'{{"cells": [], "name": "{name}"}}')
    return folder


def test_a_hand_in_is_a_copy_with_a_receipt_and_replaces_the_last(tmp_path):
    exercises = _exercises(tmp_path, "01_collectives.ipynb", "02_data_parallel.ipynb")
    (exercises / "notes.txt").write_text("not an exercise")
    receipt = hand_in(exercises, tmp_path / "handed-in")
    handed_in = tmp_path / "handed-in"
    assert sorted(p.name for p in handed_in.iterdir()) == ["01_collectives.ipynb", "02_data_parallel.ipynb", RECEIPT]
    lines = receipt.read_text().splitlines()
    assert lines[0].startswith("handed in ") and len(lines) == 3
    data = (exercises / "01_collectives.ipynb").read_bytes()
    assert f"{hashlib.sha256(data).hexdigest()}  01_collectives.ipynb" in lines
    (exercises / "02_data_parallel.ipynb").unlink()  # edited after: the hand-in stays as it was, until the next
    (exercises / "01_collectives.ipynb").write_text('{"cells": ["more"]}')
    assert (handed_in / "01_collectives.ipynb").read_bytes() == data
    hand_in(exercises, handed_in)
    assert sorted(p.name for p in handed_in.iterdir()) == ["01_collectives.ipynb", RECEIPT]
    assert (handed_in / "01_collectives.ipynb").read_text() == '{"cells": ["more"]}'


def test_links_and_empty_folders_are_refused_saying_what_to_do(tmp_path):
    exercises = _exercises(tmp_path, "01_collectives.ipynb")
    elsewhere = tmp_path / "classmate"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "linked")
    with pytest.raises(ValueError, match="is a link: remove it"):
        hand_in(exercises, tmp_path / "linked")
    with pytest.raises(ValueError, match="missing, or a link"):
        hand_in(tmp_path / "linked", tmp_path / "handed-in")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no exercise notebook"):
        hand_in(tmp_path / "empty", tmp_path / "handed-in")
    os.symlink(exercises / "01_collectives.ipynb", exercises / "02_linked.ipynb")  # a linked notebook: not handed in
    hand_in(exercises, tmp_path / "handed-in")
    assert not (tmp_path / "handed-in" / "02_linked.ipynb").exists()


def test_the_command_says_what_it_did(tmp_path):
    _exercises(tmp_path, "01_collectives.ipynb")
    run = subprocess.run([sys.executable, "-m", "course_lib.hand_in"], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
    assert run.returncode == 0 and "1 notebook, in" in run.stdout and str(tmp_path / "handed-in") in run.stdout, run
    (tmp_path / "exercises" / "01_collectives.ipynb").unlink()
    run = subprocess.run([sys.executable, "-m", "course_lib.hand_in"], capture_output=True, text=True,
                         env={**os.environ, "HOME": str(tmp_path)}, timeout=60)
    assert run.returncode == 1 and "not handed in:" in run.stderr and "holds no exercise notebook" in run.stderr, run
