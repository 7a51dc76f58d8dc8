"""What the course's tools write under the temporary folder goes when they are done: a learner who runs a
chapter ten times must not find ten copies of its scripts, logs and job files there. Each test runs the
tool in a fresh interpreter whose TMPDIR is a folder of the test's own, and lists what is left in it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def left_after(program: str, tmp_path: Path, wait_s: float = 30) -> list[str]:
    """Run ``program`` in a fresh interpreter with TMPDIR=tmp_path/"tmp"; what it left there, but for
    torch's compile cache (torchinductor_<user>: one folder per user, reused by every run, as ~/.cache is)."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    script = tmp_path / "program.py"  # a file, not -c: torchrun's script is written from the function's source
    script.write_text(textwrap.dedent(program))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "TMPDIR": str(temporary)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ran" in done.stdout, done.stdout  # the program got to its end
    deadline = time.monotonic() + wait_s  # a watcher removes a scratch folder just after its process ended
    while kept(temporary) and time.monotonic() < deadline:
        time.sleep(0.1)
    return kept(temporary)


def kept(temporary: Path) -> list[str]:
    return sorted(path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor_"))


def test_torchrun_a_command_and_a_launch_leave_nothing(tmp_path):
    # One interpreter for the three (each name says which tool left it): torchrun makes a torchelastic_*
    # folder under TMPDIR on every start and never removes it; chapter 04 runs torchrun's commands as a
    # learner types them (here the legacy launcher's); a launch keeps its ranks' output in files.
    program = """
        import sys
        from pathlib import Path
        import torch.distributed as dist
        from course_lib import launch
        from course_lib.torchrun import run_command, run_torchrun

        def rank_of_each():
            return dist.get_rank()

        assert run_torchrun(rank_of_each, nproc_per_node=2, show_output=False) == [0, 1]
        script = Path(sys.argv[0]).with_name("hello.py")
        script.write_text("print('hello')")
        done = run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                            str(script)], timeout=120)
        assert done.returncode == 0 and "hello" in done.stdout, done.stderr
        assert launch(rank_of_each, world_size=2, timeout=60, show_output=False) == [0, 1]
        print("ran")
    """
    assert left_after(program, tmp_path) == []


def test_a_scratch_folder_goes_when_the_interpreter_exits(tmp_path):
    program = """
        from course_lib.scratch import scratch_folder

        work = scratch_folder("chapter04-")
        (work / "job.sbatch").write_text("#!/bin/bash")
        assert work.is_dir() and work.name.startswith("chapter04-")
        print("ran")
    """
    assert left_after(program, tmp_path) == []


def test_a_scratch_folder_goes_when_its_kernel_is_killed(tmp_path):
    # Jupyter's shutdown runs no atexit function, and SIGKILL nothing at all: the watcher removes it.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    program = ("import time; from course_lib.scratch import scratch_folder\n"
               "print(scratch_folder('chapter10_'), flush=True); time.sleep(600)")
    kernel = subprocess.Popen([sys.executable, "-c", program], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "TMPDIR": str(temporary)})
    try:
        folder = Path(kernel.stdout.readline().strip())
        assert folder.is_dir() and folder.parent == temporary, folder
    finally:
        kernel.kill()
        kernel.wait(timeout=20)
    deadline = time.monotonic() + 30  # well within a second on an idle machine
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not folder.exists() and kept(temporary) == []


def test_the_check_sees_a_folder_left_behind(tmp_path):
    # The tests above would pass vacuously if TMPDIR did not reach the tools.
    program = """
        import tempfile
        tempfile.mkdtemp(prefix="left-")
        print("ran")
    """
    left = left_after(program, tmp_path, wait_s=2)
    assert len(left) == 1 and left[0].startswith("left-"), left
