"""Folders a sandbox's learner side could write, walked and emptied from outside: never following a link a
submission left, never entering a mount point below them (grading; introduced with chapter 01's exercises).

Used by course_lib.grading.sandbox (emptying a sandbox for the next submission) and its watchdog (the bytes
a check's ranks wrote to files).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from stat import S_ISLNK

__all__ = ["empty_folder", "holds_a_mount_point", "files_on_its_own_device"]


def empty_folder(folder: Path) -> None:
    """Remove everything in ``folder`` that is on its own device: a mount point below it (another device)
    stays, and so do the directories on the way to one (their other contents go). Never follows a link."""
    device = os.lstat(folder).st_dev
    for entry in list(folder.iterdir()):
        with contextlib.suppress(OSError):
            stat = os.lstat(entry)
            if stat.st_dev != device:
                continue
            if entry.is_dir() and not entry.is_symlink():
                if holds_a_mount_point(entry, device):
                    empty_folder(entry)
                else:
                    shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()


def holds_a_mount_point(folder: Path, device: int) -> bool:
    """Whether a directory below ``folder`` (itself on ``device``) is on another device: a mount point."""
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            with contextlib.suppress(OSError):
                if os.lstat(os.path.join(root, name)).st_dev != device:
                    return True
        dirs[:] = [name for name in dirs if not os.path.islink(os.path.join(root, name))]
    return False


def files_on_its_own_device(folder: Path):
    """(path, lstat) of every file below ``folder`` on its device: no link followed, no mount point entered."""
    try:
        device = os.lstat(folder).st_dev
    except OSError:
        return
    for root, dirs, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if (found := _own_entry(path, device)) is not None:
                yield path, found
        dirs[:] = [name for name in dirs if _own_entry(os.path.join(root, name), device) is not None]


def _own_entry(path: str, device: int) -> os.stat_result | None:
    """``path``'s lstat where it is on ``device`` and not a link; None otherwise (or if it is gone)."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found if found.st_dev == device and not S_ISLNK(found.st_mode) else None
