"""One call shared by the judge's kernel and the grader's pytest plugin (introduced with chapter 01's
exercises). It imports nothing heavy: the plugin's process must start without torch."""

import contextlib
import ctypes
import sys


def make_non_dumpable() -> None:
    """Other processes of this user can no longer read or write this one's memory, environ or fds."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            PR_SET_DUMPABLE = 4
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0)
