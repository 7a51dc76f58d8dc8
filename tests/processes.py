"""Process facts the tests check: a process a test expects gone may still be a zombie, dead but not yet
collected by whoever adopted it, and that counts as gone."""

import psutil


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
