"""`make lab-server`, as the README tells a learner to start the course (what `make lab` opens, headless)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_lab_opens_the_course_folder_so_exercises_and_solutions_are_reachable():
    """Every lesson ends by pointing to exercises/NN_*.ipynb: the lab's file browser must reach it."""
    port, token = free_port(), "course-lab-test"
    server = subprocess.Popen(["make", "-s", "lab-server", f"LAB_PORT={port}",
                               f"LAB_OPTIONS=--IdentityProvider.token={token}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline, listing = time.monotonic() + 120, None
        while listing is None and time.monotonic() < deadline and server.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents/",
                                                 headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=5) as reply:
                    listing = json.load(reply)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "make lab-server did not answer within 120 s"
        names = {entry["name"] for entry in listing["content"]}
        assert {"notebooks", "exercises", "solutions"} <= names, names
        # The URL it prints opens chapter 00, as `make lab` does (not JupyterLab's empty launcher).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/?token={token}", timeout=30) as reply:
            assert reply.url.startswith(f"http://127.0.0.1:{port}/lab/tree/notebooks/00_preflight.ipynb"), reply.url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        printed = server.communicate(timeout=30)[0]
    assert f"http://127.0.0.1:{port}/lab/tree/notebooks/00_preflight.ipynb?token=" in printed, printed[-3000:]
