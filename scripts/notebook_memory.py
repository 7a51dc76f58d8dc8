"""How much memory the notebooks need: the peak of each one's kernel and ranks, measured.

Usage:
    .venv/bin/python scripts/notebook_memory.py --measure [PATH ...]   run notebooks, record their peaks
    .venv/bin/python scripts/notebook_memory.py [--write]              check (or update) the README's sentence

--measure runs each notebook (default: every lesson and solution) top to bottom in a fresh kernel,
as scripts/execute_notebooks.py does, but stores no output. While it runs, every 0.1 s it adds up
the proportional set size (PSS) of every process the run started: the kernel, its launch server and
the ranks. PSS splits each shared page between the processes sharing it, so the sum is the memory
the run really takes from the machine (the ranks share torch's pages with the server they were
forked from; RSS would count those pages once per rank). The peak of each notebook goes to
docs/notebook_memory.json. Linux only (it reads /proc through psutil).

Without --measure, checks that the README's memory sentence says what docs/notebook_memory.json
holds (exit 1 if not); with --write, updates it. JupyterLab's own server and the browser are not
in the measurement; the sentence says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEMORY = REPO / "docs" / "notebook_memory.json"
README = REPO / "README.md"
SENTENCE = re.compile(r"Two CPU cores and \d+ GB of free memory run every notebook(?: \([^)]*\))?\.")
SAMPLE_S = 0.1


def run_pss(psutil) -> int:
    """The PSS of every process this one started (kernel, launch server, ranks), in bytes."""
    total = 0
    for process in psutil.Process(os.getpid()).children(recursive=True):
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a rank that ended between the listing and the reading
    return total


def peak_while(work, psutil) -> int:
    peak, stop = [0], threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], run_pss(psutil))
            stop.wait(SAMPLE_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        work()
    finally:
        stop.set()
        watcher.join()
    return peak[0]


def measure(paths: list[Path]) -> None:
    import psutil

    sys.path.insert(0, str(REPO / "scripts"))
    from execute_notebooks import record, run  # one way to run a notebook, one way to record it

    for path in paths:
        peak = peak_while(lambda: run(path), psutil)
        record(MEMORY, path, **{"peak PSS (GiB)": round(peak / 2**30, 2)})
        print(f"{path.resolve().relative_to(REPO).as_posix()}: peak {peak / 2**30:.2f} GiB "
              "(kernel, launch server and ranks, PSS)", flush=True)


def sentence(peaks: dict) -> str:
    largest = max(peaks, key=lambda key: peaks[key]["peak PSS (GiB)"])
    gib = peaks[largest]["peak PSS (GiB)"]
    # Free memory to ask for: the largest peak plus 1 GB for JupyterLab's server and a browser tab,
    # rounded up to whole GB.
    needed = math.ceil(gib * 2**30 / 1e9 + 1)
    return (f"Two CPU cores and {needed} GB of free memory run every notebook (the largest, "
            f"`{largest}`, peaked at {gib:.2f} GiB for its kernel and ranks, measured on "
            f"{peaks[largest]['date']} by `scripts/notebook_memory.py`; the rest is for JupyterLab and a browser).")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="run the notebooks and record their peaks")
    parser.add_argument("--write", action="store_true", help="update the README's sentence")
    parser.add_argument("paths", nargs="*", help="notebooks to measure (default: notebooks/ and solutions/)")
    options = parser.parse_args(argv)
    if options.measure:
        paths = [Path(p) for p in options.paths] or sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
            (REPO / "solutions").glob("*.ipynb"))
        measure(paths)
    peaks = json.loads(MEMORY.read_text())
    readme = README.read_text()
    if not SENTENCE.search(readme):
        print("README.md has no sentence 'Two CPU cores and N GB of free memory run every notebook ...'",
              file=sys.stderr)
        return 1
    wanted = SENTENCE.sub(sentence(peaks), readme, count=1)
    print(sentence(peaks))
    if options.write or options.measure:
        README.write_text(wanted)
        return 0
    if wanted != readme:
        print("not current: README.md (run .venv/bin/python scripts/notebook_memory.py --write)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
