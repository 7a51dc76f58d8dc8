"""One launch server for all of a user's kernels (course_lib/launcher/shared_server.py), on Linux.

Stand-in kernels (Python processes that import course_lib and launch when told to) run side by side
with a runtime folder of the test's own. Their ranks must all be forked from one server; the server
must survive a kernel killed outright, end (leaving no socket or FIFO) when its last kernel has gone,
and start again for the next. Kernels that would import torch differently, or that run in other
cgroups or namespaces, must not share it; and a runtime folder others could write in is not used.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from processes import alive

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launch server is Linux's")

# A stand-in kernel: at each line on its stdin it launches two ranks and prints the pid of the process
# each was forked from; at the end of its stdin it exits.
KERNEL = """
import json, os, sys
from course_lib import launch

def parent():
    return os.getppid()

for line in sys.stdin:
    servers = launch(parent, 2, init_process_group=False, show_output=False, timeout=120)
    print(json.dumps(sorted(set(servers))), flush=True)
"""


class Kernel:
    def __init__(self, runtime: Path, tmp_path: Path):
        script = tmp_path / "kernel.py"
        script.write_text(KERNEL)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "COURSE_CPUS": "2"}
        env.pop("COURSE_START_METHOD", None)
        self.process = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env, cwd=tmp_path)

    def launch(self) -> list[int]:
        self.process.stdin.write("launch\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the stand-in kernel ended (exit {self.process.wait(10)})"
        return json.loads(line)

    def exit(self) -> None:
        self.process.stdin.close()
        assert self.process.wait(60) == 0


@pytest.fixture
def runtime():
    """A runtime folder of the test's own, short enough for a socket's path (pytest's are not)."""
    folder = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def test_kernels_share_one_server_which_outlives_a_killed_kernel_and_ends_with_the_last(tmp_path, runtime):
    first, second = Kernel(runtime, tmp_path), Kernel(runtime, tmp_path)
    try:
        [server] = first.launch()
        assert second.launch() == [server]  # the second kernel's ranks: from the first one's server
        assert psutil.Process(server).ppid() not in (first.process.pid, second.process.pid)  # nobody's child
        assert psutil.Process(server).pid == os.getsid(server) or os.getsid(server) != os.getsid(first.process.pid)
        first.process.send_signal(signal.SIGKILL)  # a kernel killed outright: the other goes on
        first.process.wait(30)
        assert second.launch() == [server]
        second.exit()
        assert _gone_within(server, 30), "the server outlived its last kernel"
        assert [p.name for p in (runtime / "course-launch").iterdir() if not p.name.endswith(".lock")] == []

        third = Kernel(runtime, tmp_path)  # the next kernel starts a new one
        [again] = third.launch()
        assert again != server
        third.exit()
        assert _gone_within(again, 30), "the second server outlived its kernel"
    finally:
        for kernel in (first, second):
            if kernel.process.poll() is None:
                kernel.process.kill()


def test_kernels_that_differ_in_what_or_where_get_servers_of_their_own(monkeypatch):
    from course_lib.launcher import shared_server
    from course_lib.launcher.server import _SERVER_PRELOAD

    plain = shared_server.server_key(_SERVER_PRELOAD, {"TORCH_CPP_LOG_LEVEL": None})
    assert shared_server.server_key(_SERVER_PRELOAD, {"TORCH_CPP_LOG_LEVEL": None}) == plain
    assert shared_server.server_key(_SERVER_PRELOAD, {"TORCH_CPP_LOG_LEVEL": "INFO"}) != plain
    where = shared_server._where_this_process_runs()
    assert any(isinstance(each, str) and each for each in where) and len(where) >= 5, where  # cgroups, 5 namespaces
    monkeypatch.setattr(shared_server, "_where_this_process_runs", lambda: [*where[:-1], "another cgroup"])
    assert shared_server.server_key(_SERVER_PRELOAD, {"TORCH_CPP_LOG_LEVEL": None}) != plain


def test_a_runtime_folder_others_may_write_in_is_not_used(runtime, monkeypatch):
    from course_lib.launcher import shared_server

    open_to_all = runtime / "open"
    (open_to_all / "course-launch").mkdir(parents=True)
    os.chmod(open_to_all / "course-launch", 0o777)  # made by someone else, or left open
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(open_to_all))
    monkeypatch.setattr(shared_server.tempfile, "gettempdir", lambda: str(runtime / "temp"))
    (runtime / "temp").mkdir()
    chosen = shared_server.private_folder()
    assert chosen == runtime / "temp" / f"course-launch-{os.getuid()}"
    assert stat.S_IMODE(chosen.stat().st_mode) == 0o700
    os.chmod(chosen, 0o755)  # and none at all where no folder is private: a server of the kernel's own
    assert shared_server.private_folder() is None
    os.chmod(chosen, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime / ("deep" * 30)))  # too long for a socket's path: skipped
    assert shared_server.private_folder() == chosen
