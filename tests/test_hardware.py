"""course_lib.hardware (chapter 02): what a timing ran on, and the free cores a measurement can count on."""

from __future__ import annotations

import os

import psutil

from course_lib.hardware import free_cores


def test_free_cores_are_the_machines_idle_share_within_this_process_s_cores(monkeypatch):
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8)
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 75.0)  # 6 of 8 cores busy
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert free_cores(0.01) == 2.0
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 10.0)  # 7.2 free, but 4 are this process's
    assert free_cores(0.01) == 4.0
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval=None: 100.0)
    assert free_cores(0.01) == 0.0


def test_free_cores_read_the_real_counters():
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert 0.0 <= free_cores(0.2) <= mine
