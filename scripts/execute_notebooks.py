"""Re-execute notebooks in place, top to bottom, and store their outputs.

Usage: python scripts/execute_notebooks.py PATH [PATH ...]   (files or folders)

Stored outputs are what nbval compares against, so run this after editing a lesson
or a solution notebook, check the diff, and commit the notebook with its outputs.
Each notebook runs in its own folder with a fresh kernel, as JupyterLab would run it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def notebooks_in(paths: list[str]) -> list[Path]:
    found = []
    for path in map(Path, paths):
        found += sorted(path.glob("*.ipynb")) if path.is_dir() else [path]
    return [nb for nb in found if ".ipynb_checkpoints" not in nb.parts]


def execute(path: Path, timeout: int = 600) -> float:
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)  # wall-clock stamps: noise in every diff
    NotebookClient(notebook, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(notebook, path)
    return time.perf_counter() - started


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for path in notebooks_in(argv):
        seconds = execute(path)
        print(f"{path}: executed in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
