"""In a graded rank and every Python it starts: a new session asked of subprocess becomes a process group.

Introduced with the graded exercises (chapter 01 on). The ranks' seccomp filter refuses setsid
(course_lib.confine.apart: with the kernel's autogroups each session is one more share of the CPU), yet
torchrun's agent starts each worker with ``subprocess.Popen(start_new_session=True)`` and ends it with
``os.killpg(worker.pid, sig)``. A process group of its own (``process_group=0``) answers that the same way.
course_lib.confine.apart puts this folder first on the path of every Python a rank starts, so ``site``
imports this file there (any other ``sitecustomize`` on the path still runs, after it).
"""

import importlib.machinery
import importlib.util
import os
import subprocess
import sys


def sessions_become_process_groups() -> None:
    if getattr(subprocess.Popen.__init__, "_session_as_group", False):
        return
    original = subprocess.Popen.__init__

    def __init__(self, *args, start_new_session=False, process_group=None, **kwargs):
        if start_new_session and process_group is None:
            process_group = 0
        original(self, *args, process_group=process_group, **kwargs)

    __init__._session_as_group = True
    subprocess.Popen.__init__ = __init__


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sessions_become_process_groups()
if __name__ == "sitecustomize":
    _run_the_next_sitecustomize()
