"""Looking inside a running rank from outside: py-spy and waiting for a worker's pid.

Defined in chapter 10 (debugging and profiling)::

    from course_lib.debugging import py_spy_dump, wait_for_file

    ok, text = py_spy_dump(pid)     # never raises: text explains what went wrong

``py-spy dump --pid PID`` reads another process's memory to print its Python stack
(every thread). The operating system allows that only to a process with the right
to trace the target: root (with the ``CAP_SYS_PTRACE`` capability in a container), or
on Linux the same user when ``/proc/sys/kernel/yama/ptrace_scope`` is 0; macOS always
asks for ``sudo``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

__all__ = ["py_spy_dump", "py_spy_path", "wait_for_file", "PTRACE_HELP"]

PTRACE_HELP = (
    "py-spy could not read the process. It needs permission to trace another process: "
    "on Linux run it as root (`sudo py-spy dump --pid PID`), or as the same user with "
    "`echo 0 | sudo tee /proc/sys/kernel/yama/ptrace_scope`; in Docker start the "
    "container with `--cap-add SYS_PTRACE`; on macOS run it with sudo."
)


def py_spy_path() -> str | None:
    """The py-spy executable next to this Python (a virtual environment's bin/), or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(beside):
        return beside
    return shutil.which("py-spy")


def py_spy_dump(pid: int, timeout: float = 20.0) -> tuple[bool, str]:
    """``py-spy dump --pid pid``: (True, the stacks) or (False, why it could not, and the fix)."""
    exe = py_spy_path()
    if exe is None:
        return False, "py-spy is not installed: `pip install py-spy` (it is in the course's requirements)."
    try:
        run = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"py-spy did not answer within {timeout:g} s."
    if run.returncode == 0:
        return True, _readable_dump(run.stdout)
    reason = (run.stderr or run.stdout).strip().splitlines()
    reason = reason[-1] if reason else f"exit code {run.returncode}"
    if "ermission" in reason or "ptrace" in reason.lower() or "root" in reason:
        return False, f"{reason}\n{PTRACE_HELP}"
    return False, f"py-spy failed: {reason}"


def _readable_dump(text: str) -> str:
    """py-spy's dump without terminal colours, and without the long command line of a worker
    (a worker forked from the launch server carries the server's command line)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"^(Python v[\d.]+) \(.*\)$", r"\1", text, count=1, flags=re.M)  # no machine paths
    return re.sub(r"^(Process \d+): .*$", r"\1: a launch worker", text, count=1, flags=re.M)


def wait_for_file(path, timeout: float = 30.0) -> str | None:
    """The text of ``path`` once it exists and is not empty, or None after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            if text:
                return text
        time.sleep(0.05)
    return None
