"""A chapter's scratch folder, removed once the kernel that made it has ended (chapter 04; used by 08 and 10).

``tempfile.mkdtemp`` leaves its folder behind for good: run a chapter ten times and the machine's
temporary folder holds ten copies of its scripts, traces and job files. A kernel cannot remove them on
its way out: Jupyter's shutdown runs no ``atexit`` function, and a killed kernel runs nothing. So a
small watcher process does it: it reads the folders' names from a pipe whose writing end only the
kernel holds, and when the pipe closes (the kernel has ended, however it ended) removes them. Copy
out of a scratch folder any file you want to keep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# Runs in the watcher: read until the pipe closes, then remove what was named.
_WATCHER = ("import shutil, sys\n"
            "folders = sys.stdin.read().split('\\0')\n"
            "for folder in filter(None, folders):\n"
            "    shutil.rmtree(folder, ignore_errors=True)\n")
_watchers: dict[int, subprocess.Popen] = {}  # by the pid of the process whose folders it removes
_lock = threading.Lock()


def scratch_folder(prefix: str) -> Path:
    """A new empty folder under the temporary folder, named ``prefix`` + random letters, removed
    once this process has ended."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    with _lock:
        watcher = _watcher()
        watcher.stdin.write(f"{folder}\0")
        watcher.stdin.flush()
    return folder


def _watcher() -> subprocess.Popen:
    # One per process (a forked child gets its own). Its own session, so that a signal to this
    # process's group does not stop it before its work; an empty environment, so that it passes for
    # no one's worker (tests find a run's processes by a variable of their environment).
    watcher = _watchers.get(os.getpid())
    if watcher is None or watcher.poll() is not None:
        watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER], stdin=subprocess.PIPE, text=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   env={})
        _watchers[os.getpid()] = watcher
    return watcher
