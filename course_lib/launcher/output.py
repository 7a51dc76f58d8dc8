"""What each rank prints: per-rank files (or, in a judged launch, pipes the judge drains), shown in
rank order when the launch ends, each line prefixed ``[rank r]``.

Introduced in chapter 00 (preflight): a launch's output is the same from run to run, whichever
rank printed first. The pipes (``_Drain``) came with grading (course_lib.grading).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import stat
import sys
import tempfile
import threading

try:
    import fcntl
except ImportError:  # Windows: no flock, and no folder is ever taken for abandoned
    fcntl = None

# The files of one rank: what it prints, its error stream, its stack dumps, its progress.
_RANK_FILE_KINDS = ("out", "err", "stack", "progress")


def _rank_paths(workdir: str, world_size: int) -> dict[str, list[str]]:
    """Each kind of rank file, one path per rank, in the launch's own folder."""
    return {kind: [os.path.join(workdir, f"rank{r}.{kind}") for r in range(world_size)]
            for kind in _RANK_FILE_KINDS}


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _print_transcript(out_paths, err_paths, world_size) -> None:
    """Each rank's output, in rank order, each line prefixed with its rank."""
    for stream, paths in ((sys.stdout, out_paths), (sys.stderr, err_paths)):
        for rank in range(world_size):
            text = _read_text(paths[rank])
            for line in text.splitlines():
                stream.write(f"[rank {rank}] {line}\n")
        stream.flush()


_FOLDER_PREFIX = "course_launch_"
_IN_USE = ".in-use"  # locked (flock) by the process whose launch uses the folder, for as long as it runs


def _launch_folder(judged: bool) -> tuple[str, object]:
    """A new folder for one launch's rank files, and (but for a judged launch, whose judge has a temporary
    folder of its own, removed with it) the open file whose lock marks the folder in use.

    A launch removes its folder when it ends, but a kernel killed mid-launch cannot: so each launch
    first removes this user's folders whose lock no process holds (the system releases a lock when
    the process holding it ends, however it ends, in whatever namespace it ran)."""
    if judged or fcntl is None:
        return tempfile.mkdtemp(prefix=_FOLDER_PREFIX), None
    _remove_abandoned_folders()
    folder = tempfile.mkdtemp(prefix=_FOLDER_PREFIX)
    held = open(os.path.join(folder, _IN_USE + ".new"), "wb")
    fcntl.flock(held, fcntl.LOCK_EX)
    os.rename(held.name, os.path.join(folder, _IN_USE))  # found by another launch only once locked
    return folder, held


def _remove_abandoned_folders() -> None:
    with contextlib.suppress(OSError), os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            if entry.name.startswith(_FOLDER_PREFIX) and _abandoned(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)


def _abandoned(folder: str) -> bool:
    """This user's own folder (not a link), with a lock file that no process holds any more."""
    try:
        found = os.lstat(folder)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
            return False
        with open(os.path.join(folder, _IN_USE), "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes
            return True
    except OSError:  # held (in use), gone, or not ours to open
        return False


def _remove_rank_files(workdir: str, paths: dict, judged: bool, held=None) -> None:
    """The launch's folder and its files, gone (a judged launch's whole folder: the learner's home too)."""
    if held is not None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(workdir, _IN_USE))
        held.close()
    for path in sum(paths.values(), []):
        for leftover in (path, path + ".tmp"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)
    if judged:
        shutil.rmtree(workdir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(workdir)


class _Drain:
    """One pipe from a judged rank (its stdout, stderr or stack dumps), read by the judge.

    Counts every byte that came through (so the rank's writes to it are not taken for bytes
    sent to its peers) and keeps the first ``keep`` bytes in the file at ``path`` for the
    report. The rank cannot change either: only the judge holds the read end.
    """

    def __init__(self, path: str, keep: int = 1 << 20):
        self.read_fd, self.write_fd = os.pipe()
        self.path, self.keep, self.count = path, keep, 0
        self.lock = threading.Lock()
        self.file = open(path, "wb")
        self.thread = threading.Thread(target=self._run, name="rank-output", daemon=True)

    def started(self) -> None:
        """The rank has its copy of the write end: close ours, so the end of the rank ends the pipe."""
        os.close(self.write_fd)
        self.write_fd = None
        self.thread.start()

    def _read(self, blocking: bool) -> bool:
        if not blocking and not select.select([self.read_fd], [], [], 0)[0]:
            return False
        try:
            chunk = os.read(self.read_fd, 1 << 16)
        except OSError:
            return False
        if not chunk:
            return False
        self.count += len(chunk)
        room = self.keep - self.file.tell()
        if room > 0:
            self.file.write(chunk[:room])
            self.file.flush()
        return True

    def _run(self) -> None:
        while True:
            with self.lock:
                if self.read_fd is None:
                    return
            ready = select.select([self.read_fd], [], [], 0.2)[0]
            with self.lock:
                if self.read_fd is None:
                    return
                if ready and not self._read(blocking=True):
                    return

    def drained(self) -> int:
        """Every byte the rank has written to this pipe so far (what is waiting is read first)."""
        with self.lock:
            while self.read_fd is not None and self._read(blocking=False):
                pass
            return self.count

    def close(self) -> None:
        with self.lock:
            for fd in (self.read_fd, self.write_fd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.read_fd = self.write_fd = None
            self.file.close()
