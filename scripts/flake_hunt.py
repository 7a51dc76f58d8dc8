"""Run the whole test suite several times in a row beside busy loops, and list every test that ever failed.

Usage: .venv/bin/python scripts/flake_hunt.py [--runs 3] [--busy 2] [--command "bash .ci/run"] [--run-timeout-min 90]

A flaky test fails by chance: once in many runs, more often on a busy machine. This script makes
such a machine on purpose and runs the suite again and again from one fresh clone of this repository's
committed HEAD (uncommitted changes are not in it), as CI does:

* the first run installs (``bash .ci/run`` as root installs the browser, the hub and the Slurm cluster too);
  later runs reuse the clone's ``.venv`` after ``git clean``, so each run starts from the same files;
* beside every run, ``--busy`` processes spin on the CPU for the whole run (a browser, a video call, a
  neighbour's training), stopped when the run ends;
* each run is stopped (its whole process group) after ``--run-timeout-min`` minutes.

For each run it prints the wall time, the pytest summary line and the tests that failed; at the end,
every test that failed in any run, with how many runs it failed in. Exit 1 if any run failed.
The clone and each run's log and durations table stay in ``--keep`` (default: a new folder under /tmp).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUMMARY_LINE = re.compile(r"^=+ .*\b(passed|failed|error|errors|skipped)\b.* in [\d.]+s.* =+$")
FAILED_TEST = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$")  # a test id may hold spaces: "[as run]"


class _Sigterm:
    """`kill` of this script (not only Ctrl-C) must end the running suite and the busy loops too: the
    handler raises SystemExit, which runs the finally blocks that stop them (the default SIGTERM death
    skips them). Inside ``deferred()``, which starts what such a block must stop, a SIGTERM waits until
    the block's end, when what it started is known to that finally block."""

    held = False
    pending: int | None = None

    @classmethod
    def install(cls) -> None:
        signal.signal(signal.SIGTERM, cls._handle)

    @classmethod
    def _handle(cls, signum, frame) -> None:
        cls.pending = signum
        if not cls.held:
            cls._exit()

    @classmethod
    @contextlib.contextmanager
    def deferred(cls):
        cls.held = True
        try:
            yield
        finally:
            cls.held = False
            if cls.pending is not None:
                cls._exit()

    @classmethod
    def _exit(cls) -> None:
        sys.exit(f"flake hunt stopped by signal {cls.pending}")


def start_busy_loops(count: int) -> list[subprocess.Popen]:
    # The last argument names this hunt, so its own loops can be told from any other's (a hunt of the
    # suite runs this script's test, which hunts with a stand-in).
    return [subprocess.Popen([sys.executable, "-c", "while True: pass", f"busy beside flake hunt {os.getpid()}"],
                             stdin=subprocess.DEVNULL) for _ in range(count)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


def run_once(command: str, clone: Path, log: Path, timeout_s: float) -> tuple[int | None, float]:
    """The command in the clone, in a process group of its own, its output to ``log``: (exit code or
    None if it was stopped at the timeout, minutes)."""
    started = time.monotonic()
    with open(log, "wb") as out:
        process = None
        try:
            with _Sigterm.deferred():
                process = subprocess.Popen(["bash", "-c", command], cwd=clone, stdout=out,
                                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # the suite's own workers, kernels and browsers go with it
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return code, (time.monotonic() - started) / 60


def outcome(log: Path) -> tuple[str, list[str]]:
    """The last pytest summary line of a run's log, and the tests it reports as failed."""
    lines = log.read_text(errors="replace").splitlines()
    summary = next((line.strip("= ") for line in reversed(lines) if SUMMARY_LINE.match(line)), "no pytest summary")
    failed = list(dict.fromkeys(m.group(1) for line in lines if (m := FAILED_TEST.match(line))))
    return summary, failed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside each run")
    parser.add_argument("--command", default="CI=true bash .ci/run", help="what one run is, in the clone")
    parser.add_argument("--run-timeout-min", type=float, default=90.0, help="a run still going then is stopped")
    parser.add_argument("--keep", type=Path, help="folder for the clone and the logs (default: a new one)")
    options = parser.parse_args(argv)
    if options.runs < 1 or options.busy < 0:
        parser.error("--runs must be 1 or more and --busy 0 or more")

    _Sigterm.install()
    keep = options.keep or Path(tempfile.mkdtemp(prefix="flake-hunt-"))
    keep.mkdir(parents=True, exist_ok=True)
    clone = keep / "clone"
    shutil.rmtree(clone, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True,
                          check=True).stdout.strip()
    print(f"{options.runs} runs of `{options.command}` on {head}, from a fresh clone in {clone}, each beside "
          f"{options.busy} busy loops, on {os.cpu_count()} cores", flush=True)

    failures: collections.Counter[str] = collections.Counter()
    failed_runs = 0
    for number in range(1, options.runs + 1):
        if number > 1:  # the same files as the first run, its installed environment kept
            subprocess.run(["git", "clean", "-xdfq", "-e", ".venv"], cwd=clone, check=True)
        log = keep / f"run{number}.log"
        busy = []
        try:
            with _Sigterm.deferred():
                busy += start_busy_loops(options.busy)
            code, minutes = run_once(options.command, clone, log, options.run_timeout_min * 60)
        finally:
            stop(busy)
        summary, failed = outcome(log)
        durations = clone / ".test-durations.jsonl"
        if durations.exists():
            shutil.copy(durations, keep / f"run{number}-durations.jsonl")
        ended = "stopped at the timeout" if code is None else f"exit {code}"
        print(f"run {number}: {ended} after {minutes:.1f} min: {summary}", flush=True)
        for test in failed:
            print(f"    failed: {test}", flush=True)
        failures.update(failed)
        failed_runs += code != 0

    print(f"{options.runs - failed_runs} of {options.runs} runs passed; logs in {keep}")
    for test, count in failures.most_common():
        print(f"  {test}: failed in {count} of {options.runs} runs")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
