"""How long the course's set-up takes with pip and with uv, from the same lock, side by side.

Usage: .venv/bin/python scripts/bench_setup.py [--installers pip uv] [--extras test,ft]

Each installer gets a new virtual environment in a temporary folder and installs what `make setup`
installs (the course, editable, with the extras named, every version from requirements.lock and
constraints.txt) with its download cache off, so every wheel is downloaded again: a newcomer's first
`make`. Prints each one's seconds and the environment's size, and the ratio to the first. The folder
is removed at the end. Needs the network (PyPI) and about 7 GB of free disk per installer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from setup_size import folder_bytes  # noqa: E402


def uv_version() -> str:
    """The uv the Makefile pins (UV_VERSION), so the benchmark times the installer `make` would use."""
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("UV_VERSION"):
            return line.split("=", 1)[1].strip()
    raise SystemExit("no UV_VERSION in the Makefile")


def install_commands(installer: str, venv: Path, extras: str) -> list[list[str]]:
    python = str(venv / "bin" / "python")
    target = f".[{extras}]" if extras else "."
    locked = ["-c", "constraints.txt", "-c", "requirements.lock", "-e", target]
    if installer == "pip":
        return [[python, "-m", "pip", "install", "-q", "--no-cache-dir", *locked]]
    return [[python, "-m", "pip", "install", "-q", "--no-cache-dir", f"uv=={uv_version()}"],
            # compiled to bytecode at install, as pip does: a process that runs with -B (the launcher's ranks)
            # would otherwise compile every module it imports, torch's included, each time it starts
            [str(venv / "bin" / "uv"), "pip", "install", "-q", "--no-cache", "--compile-bytecode", "--python", python,
             *locked]]


def timed_setup(installer: str, folder: Path, extras: str) -> tuple[float, int]:
    venv = folder / installer
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True)  # the Python `make` takes (PYTHON ?= python3)
    started = time.monotonic()
    for command in install_commands(installer, venv, extras):
        subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "PIP_FIND_LINKS": ""})
    seconds = time.monotonic() - started
    return seconds, folder_bytes(venv)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--installers", nargs="+", choices=("pip", "uv"), default=["pip", "uv"])
    parser.add_argument("--extras", default="test,ft", help="the course's extras, as `make setup` installs them")
    options = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench_setup_"))
    results = {}
    try:
        for installer in options.installers:
            results[installer] = timed_setup(installer, folder, options.extras)
            print(f"{installer}: {results[installer][0]:.0f} s", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    first = results[options.installers[0]][0]
    print(f"\n{'installer':<10} {'seconds':>8} {'ratio':>6} {'GB':>5}")
    for installer, (seconds, size) in results.items():
        print(f"{installer:<10} {seconds:8.0f} {seconds / first:6.2f} {size / 1e9:5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
