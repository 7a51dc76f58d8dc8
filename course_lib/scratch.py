"""A chapter's scratch folder, removed once the kernel that made it has ended (chapter 04; used by 10).

``tempfile.mkdtemp`` leaves its folder behind for good: run a chapter ten times and the machine's
temporary folder holds ten copies of its scripts, traces and job files. A kernel cannot remove them on
its way out (Jupyter's shutdown runs no ``atexit`` function, and a killed kernel runs nothing), so a
small watcher process does it once the kernel has ended (``course_lib.launcher.leftovers``). Copy out of
a scratch folder any file you want to keep.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .launcher.leftovers import remove_when_this_process_ends


def scratch_folder(prefix: str) -> Path:
    """A new empty folder under the temporary folder, named ``prefix`` + random letters, removed
    once this process has ended."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    remove_when_this_process_ends(folder)
    return folder
