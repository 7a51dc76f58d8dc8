"""course_lib.hardware (chapter 02): what a timing ran on, and the free cores a measurement can count on."""

from __future__ import annotations

import os

import psutil

import course_lib.hardware as hardware
from course_lib.hardware import cores_here, free_cores, machine_load


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


def test_cores_here_are_the_real_ones_whatever_course_cpus_pretends(monkeypatch):
    monkeypatch.setenv("COURSE_CPUS", "8")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert cores_here() == 2
    assert "of 2 cores free" in hardware.load_line(free=1.5)   # not "of 8": the free cores are real ones


def test_machine_load_takes_the_load_before_and_after_in_that_order(monkeypatch):
    readings = iter([1.8, 0.4])     # free cores: first before the measurement, then after it
    monkeypatch.setattr(hardware, "free_cores", lambda seconds=0.5: next(readings))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    ran = []
    with machine_load() as load:
        ran.append(load.after)      # nothing about "after" is known while the measurement runs
    assert ran == [None]
    assert (load.free_before, load.free_after) == (1.8, 0.4)
    before, after = str(load).splitlines()
    assert "1.8 of 2 cores free" in before and "torch" in before
    assert after.startswith("after the measurement:") and "0.4 of 2 cores free" in after


def test_machine_load_says_when_the_measurement_never_ended(monkeypatch):
    monkeypatch.setattr(hardware, "free_cores", lambda seconds=0.5: 2.0)
    load = machine_load().__enter__()
    assert str(load).splitlines()[1] == "after the measurement: not reached"
