"""`make lab-server`, as the README tells a learner to start the course (what `make lab` opens, headless)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

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


def start_a_kernel_and_run(port: int, token: str) -> tuple[str, int]:
    """Starts a kernel through the lab's REST API, runs `6 * 7` in it over the transport its connection
    file names, and returns (that transport, the result)."""
    from jupyter_client import BlockingKernelClient
    from jupyter_core.paths import jupyter_runtime_dir

    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/kernels", method="POST", data=b"{}",
                                     headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        kernel_id = json.load(reply)["id"]
    connection_file = Path(jupyter_runtime_dir()) / f"kernel-{kernel_id}.json"
    deadline = time.monotonic() + 60
    while not connection_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    client = BlockingKernelClient(connection_file=str(connection_file))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        reply = client.execute_interactive("result = 6 * 7", user_expressions={"answer": "result"}, timeout=60)
        answer = int(reply["content"]["user_expressions"]["answer"]["data"]["text/plain"])
    finally:
        client.stop_channels()
    return client.transport, answer


@pytest.mark.parametrize("options, transport", [("", "ipc"), ("--KernelManager.transport=tcp", "tcp")],
                         ids=["as-installed", "tcp-by-hand"])
def test_kernels_talk_to_the_lab_over_unix_sockets_not_tcp(options, transport):
    """On Linux the course's lab starts kernels on IPC (jupyter/jupyter_server_config.py): no TCP port for
    another local user to reach, and no "running over TCP without encryption" warning at every start.
    Started with TCP by hand, the same test sees the warning: what the first case's silence proves."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the course keeps Jupyter's TCP transport on macOS (see jupyter/jupyter_server_config.py)")
    port, token = free_port(), "course-lab-test"
    server = subprocess.Popen(["make", "-s", "lab-server", f"LAB_PORT={port}",
                               f"LAB_OPTIONS=--IdentityProvider.token={token} {options}"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                time.sleep(0.5)
        used, answer = start_a_kernel_and_run(port, token)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        printed = server.communicate(timeout=30)[0]
    assert (used, answer) == (transport, 42)
    warned = "Kernel is running over TCP without encryption" in printed
    assert warned == (transport == "tcp"), printed[-3000:]
