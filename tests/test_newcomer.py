"""A newcomer's first hour, replayed as the README tells it, in the real browser.

From a copy of the course as a clone holds it (the tracked files, no outputs of earlier runs; the
environment linked, since `make setup` is measured on its own): `make lab-server` as written, its
printed URL opened, chapter 00 run top to bottom (Run All) and compared with its stored outputs as
nbval does, then exercise 1 of chapter 01 answered wrongly, checked, read, answered again and
checked, the notebook saved from JupyterLab and graded with the grading guide's command. Every
message the newcomer meets on the way is read for a command that could lose their work.

Chapter 00's run here is the suite's run of it in the default kernel (the browser test runs it
again with every worker started by spawn), so nbval does not run it a third time.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from browser import (StoredFacts, browser_page, missing_requirements, open_notebook, paste_into_cell, run_cell,
                     run_notebook, save_notebook)
from optional import skip_or_fail

REPO = Path(__file__).resolve().parents[1]

# The answer the lesson's naive all-reduce suggests, with the classic slip: rank 0 adds up what it
# receives and never sends the total back.
WRONG_ANSWER = '''def all_reduce_via_send_recv(tensor):
    """Sum `tensor` over all ranks, in place, using only dist.send and dist.recv; return `tensor`."""
    if dist.get_rank() == 0:
        for source in range(1, dist.get_world_size()):
            received = torch.empty_like(tensor)
            dist.recv(received, src=source)
            tensor += received
    else:
        dist.send(tensor, dst=0)
    return tensor
'''

RIGHT_ANSWER = '''def all_reduce_via_send_recv(tensor):
    """Sum `tensor` over all ranks, in place, using only dist.send and dist.recv; return `tensor`."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for source in range(1, world_size):
            received = torch.empty_like(tensor)
            dist.recv(received, src=source)
            tensor += received
        for destination in range(1, world_size):
            dist.send(tensor, dst=destination)
    else:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)
    return tensor
'''

# Deny by default: the only `make` targets a message may suggest to a learner are these, none of
# which touches their notebooks (`make exercises` rewrites exercises/, so it is not among them).
SAFE_MAKE_TARGETS = {"lab", "lab-server", "setup", "test", "test-quick", "browser-deps", "slurm-up", "slurm-down"}
# ... and no message may suggest any of these at all.
LOSES_WORK = re.compile(r"\b(git\s+(checkout|reset|clean|restore|stash|rm)|rm\s+-|make_exercises\.py|"
                        r"--overwrite|--force)\b")


def suggestions_that_could_lose_work(text: str) -> list[str]:
    found = [f"make {target}" for target in re.findall(r"\bmake\s+([a-z][\w-]*)", text)
             if target not in SAFE_MAKE_TARGETS]
    return found + [match.group(0) for match in LOSES_WORK.finditer(text)]


def test_the_scan_for_destructive_advice_catches_what_it_is_for():
    assert suggestions_that_could_lose_work("stale exercise: run `make exercises`") == ["make exercises"]
    assert suggestions_that_could_lose_work("undo it with git checkout exercises/") == ["git checkout"]
    assert suggestions_that_could_lose_work("then rm -rf .venv") == ["rm -"]
    assert suggestions_that_could_lose_work("run `make lab`, or `make test`; git log shows it") == []


def a_fresh_copy(destination: Path) -> Path:
    """The tracked files, as a fresh clone of this tree holds them, and the environment linked."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet committed is not in a clone either
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    (destination / ".venv").symlink_to(REPO / ".venv")
    return destination


class LabFromMake:
    """`make lab-server` as the README shows it, in ``course``; its printed URL, and what the browser
    helpers need (a URL for a path, the served root, its kernels stopped)."""

    def __init__(self, course: Path, port: int):
        self.root, self.port, self.token, self.printed = course, port, None, []
        # No token of ours: the server makes one and prints it in the URL, as a learner sees it.
        options = f"--LabApp.workspaces_dir={course / '.workspaces'}"
        # -o: the linked environment is taken as set up, never made again from this copy
        self.process = subprocess.Popen(["make", "-s", "-o", ".venv/.course-installed", "lab-server",
                                         f"LAB_PORT={port}", f"LAB_OPTIONS={options}"],
                                        cwd=course, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.printed.append(line)

    def printed_url(self, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in list(self.printed):
                found = re.search(rf"http://127\.0\.0\.1:{self.port}/\S*\?token=(\w+)", line)
                if found:
                    self.token = found.group(1)
                    return found.group(0)
            time.sleep(0.5)
        raise AssertionError(f"make lab-server printed no URL within {timeout_s:.0f} s:\n{''.join(self.printed)[-3000:]}")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def shut_down_kernels(self, timeout_s: float = 60) -> list[str]:
        from browser import JupyterLab

        return JupyterLab.shut_down_kernels(self, timeout_s)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@pytest.fixture
def page():
    skip_or_fail(missing_requirements(), "COURSE_REQUIRE_BROWSER", "the newcomer test")
    with browser_page() as page:
        yield page


@pytest.mark.timeout(1500)
def test_a_newcomers_first_hour(tmp_path, page):
    from test_lab import free_port

    course = a_fresh_copy(tmp_path / "course")
    lab = LabFromMake(course, free_port())
    seen = []  # every message the newcomer read
    try:
        # 1. The URL make lab-server prints opens chapter 00, as `make lab` does.
        page.goto(lab.printed_url())
        page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=120_000)
        page.wait_for_function("() => [...document.querySelectorAll('.jp-mod-current.lm-mod-closable')]"
                               ".some(tab => tab.textContent.trim() === '00_preflight.ipynb')", timeout=60_000)
        assert page.url.split("?")[0].endswith("/lab/tree/notebooks/00_preflight.ipynb"), page.url

        # 2. Chapter 00, Run All: every check passes, every output as stored.
        lesson = "notebooks/00_preflight.ipynb"
        run = run_notebook(page, lab, lesson, StoredFacts.of(REPO / lesson), None, timeout_s=900,
                           compare_with=REPO / lesson, sanitize_file=REPO / "tests" / "nbval_sanitize.cfg")
        assert not run.problems, f"chapter 00 in the browser ({run.seconds:.0f} s):\n" + "\n".join(run.problems)
        seen.append(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").inner_text(timeout=30_000))
        assert not lab.shut_down_kernels()

        # 3. Chapter 01's exercise 1: the setup cell, a wrong answer and its check, then a right one.
        exercise = "exercises/01_collectives.ipynb"
        open_notebook(page, lab, exercise)
        seen.append(run_cell(page, 0))
        paste_into_cell(page, 1, WRONG_ANSWER)
        seen.append(run_cell(page, 1))
        feedback = run_cell(page, 2)
        seen.append(feedback)
        assert "\u2718" in feedback and "\u2714" not in feedback, feedback
        assert "rank 1" in feedback, f"the feedback does not say which rank came out wrong:\n{feedback}"
        paste_into_cell(page, 1, RIGHT_ANSWER)
        seen.append(run_cell(page, 1))
        passed = run_cell(page, 2)
        seen.append(passed)
        assert "\u2714 all_reduce from send/recv, 4 ranks: passed" in passed and "\u2718" not in passed, passed
        assert save_notebook(page, course / exercise), "the exercise notebook could not be saved from JupyterLab"
        assert not lab.shut_down_kernels()
    finally:
        lab.stop()

    # 4. Graded as docs/grading.md shows, with the hidden cases: exercise 1's points, none for the others.
    student = course / "SUBMISSIONS" / "newcomer"
    student.mkdir(parents=True)
    shutil.copy(course / exercise, student)
    grading = subprocess.run(["bash", "-c", ".venv/bin/python scripts/grade.py SUBMISSIONS"], cwd=course,
                             capture_output=True, text=True, timeout=600)
    assert grading.returncode == 0, grading.stdout + grading.stderr
    row = next(csv.DictReader((course / "SUBMISSIONS" / "grades.csv").open()))
    report = (student / "feedback.txt").read_text()
    seen += [grading.stdout, grading.stderr, report]
    # 3 points for exercise 1, none for exercises 2 and 3, still the stubs (and no other chapter handed in)
    assert float(row["01_collectives"]) == 3 and float(row["total"]) == 3, (row, report)
    assert "01_collectives.ipynb: 3 of 8 points" in report and "[3/3] all_reduce from send/recv" in report, report

    risky = [found for text in seen for found in suggestions_that_could_lose_work(text)]
    assert not risky, f"a message suggested what could lose the newcomer's work: {risky}"
