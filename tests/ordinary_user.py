"""Run a command as an ordinary user on a busy desktop: how an instructor without root grades.

Usage (as root): python tests/ordinary_user.py COMMAND [ARGS...]

Used by tests/test_sandbox.py so that the grading sandbox is also tested without root (no
cgroups: its process limit is RLIMIT_NPROC, its memory limit the judge's watchdog). It:

* enters a private mount namespace (``unshare --mount``: nothing of it is seen outside), where
  each directory on the way to this Python and this repository that an ordinary user cannot
  enter (a pyenv under /root, mode 700) is covered by a tmpfs holding only the way through;
* becomes uid/gid 65534 (nobody), with no supplementary groups;
* starts EXTRA_THREADS idle threads of that user first, as a desktop's browser and editor do:
  the kernel counts every task of a user against RLIMIT_NPROC, not just the sandbox's;
* runs COMMAND, and exits with its status.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

NOBODY = 65534
EXTRA_THREADS = 1100  # more than the sandbox's own allowance of 1,024 tasks
REPO = Path(__file__).resolve().parents[1]


def needed_paths() -> list[Path]:
    return [Path(p).resolve() for p in {sys.base_prefix, sys.prefix, str(REPO)}]


def blocked_directories(paths: list[Path]) -> list[Path]:
    """Directories on the way to ``paths`` that others cannot enter, shallowest first."""
    blocked = set()
    for path in paths:
        for directory in [*reversed(path.parents), path]:
            if directory != Path("/") and not directory.stat().st_mode & stat.S_IXOTH:
                blocked.add(directory)
    return sorted(blocked, key=lambda d: len(d.parts))


def open_the_way(paths: list[Path]) -> None:
    """In this (private) mount namespace: cover each blocked directory with a tmpfs that holds only
    its children on the way to ``paths``, bound from the real ones."""
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    for directory in blocked_directories(paths):
        stash = Path(tempfile.mkdtemp(dir=os.environ["COURSE_ORDINARY_USER_STASHES"]))
        subprocess.run(["mount", "--bind", str(directory), str(stash)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(directory)], check=True)
        children = {path.relative_to(directory).parts[0] for path in paths
                    if path != directory and directory in path.parents}
        for child in sorted(children):
            (directory / child).mkdir() if (stash / child).is_dir() else (directory / child).touch()
            subprocess.run(["mount", "--bind", str(stash / child), str(directory / child)], check=True)


def become_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    os.environ.update(HOME=tempfile.gettempdir(), USER="nobody", LOGNAME="nobody", PYTHONDONTWRITEBYTECODE="1")


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(__doc__)
    if os.geteuid() != 0:
        raise SystemExit("tests/ordinary_user.py needs root (it switches to an ordinary user); "
                         "as an ordinary user, run the command itself")
    if os.environ.get("COURSE_ORDINARY_USER_NAMESPACE") != "1":  # first, a mount namespace of our own
        os.environ["COURSE_ORDINARY_USER_NAMESPACE"] = "1"
        # The stashes (mount points of the namespace) are folders of the real /tmp: made in one this
        # process removes when the command has ended, with the namespace and its mounts.
        stashes = tempfile.mkdtemp(prefix="ordinary-user-stashes-")
        os.environ["COURSE_ORDINARY_USER_STASHES"] = stashes
        try:
            return subprocess.run(["unshare", "--mount", sys.executable, __file__, *argv]).returncode
        finally:
            shutil.rmtree(stashes, ignore_errors=True)
    open_the_way(needed_paths())
    become_nobody()
    unreadable = [p for p in needed_paths() if not os.access(p, os.R_OK | os.X_OK)]
    if unreadable:
        raise SystemExit(f"an ordinary user cannot read {unreadable} (their own modes forbid it)")
    idle = threading.Event()
    for _ in range(EXTRA_THREADS):
        threading.Thread(target=idle.wait, daemon=True).start()
    try:
        return subprocess.run(argv).returncode
    finally:
        idle.set()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
