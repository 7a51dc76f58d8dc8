"""Folders removed once the process that made them has ended, however it ended (chapter 04's scratch
folders).

A process cannot remove its files on its way out when it is killed, and a Jupyter kernel cannot even
when it is shut down politely: its shutdown runs no ``atexit`` function. So a small watcher process
does it: it reads the folders' names from a pipe whose writing end only this process holds, and when
the pipe closes (this process has ended) removes them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

# Runs in the watcher: read until the pipe closes, then remove what was named.
_WATCHER = ("import shutil, sys\n"
            "folders = sys.stdin.read().split('\\0')\n"
            "for folder in filter(None, folders):\n"
            "    shutil.rmtree(folder, ignore_errors=True)\n")
_watchers: dict[int, subprocess.Popen] = {}  # by the pid of the process whose folders it removes
_lock = threading.Lock()


def remove_when_this_process_ends(folder) -> None:
    """Remove ``folder`` (and what it holds) once this process has ended."""
    with _lock:
        watcher = _watcher()
        watcher.stdin.write(f"{os.fspath(folder)}\0")
        watcher.stdin.flush()


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
