"""Run notebooks' code cells top to bottom in plain Python processes, without Jupyter.

Usage: .venv/bin/python scripts/run_cells.py [--timeout S] NOTEBOOK [NOTEBOOK ...]

For a machine where Jupyter, nbformat and nbval cannot be installed (a GPU machine lent with its
own image): scripts/gpu_check.py falls back to this for its notebook check. Each notebook runs in a
fresh Python process started in the notebook's folder, as a fresh kernel would be: the .ipynb is read
as JSON, and its code cells run one after another in one namespace whose ``__name__`` is
``"__main__"``. Each cell's source is registered with ``linecache`` under its own name, so
``inspect.getsource`` finds the functions it defines (``write_torchrun_script`` needs that), and
matplotlib draws with its Agg backend. Outputs are not compared, as with ``nbval --nbval-lax``:
a notebook passes when no cell raises. A cell that fails only because IPython or ipywidgets is not
installed (the explorers' widgets) is counted apart and the run goes on (without IPython,
``IPython.display.display`` prints its arguments); any other error stops the
notebook and is reported with the cell's number (counted from 0 over all cells, as in the JSON).
Exit 1 if a notebook failed.
"""

from __future__ import annotations

import argparse
import json
import linecache
import os
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

NEEDS_JUPYTER = ("IPython", "ipywidgets", "ipykernel")
RESULT = "run_cells result: "


def _stand_in_for_ipython() -> None:
    """Without IPython, ``from IPython.display import display`` prints what it is given."""
    try:
        import IPython  # noqa: F401
    except ModuleNotFoundError:
        ipython, shown = types.ModuleType("IPython"), types.ModuleType("IPython.display")
        ipython.get_ipython = lambda: None  # not in a kernel: the launcher prints at the end
        ipython.version_info = (0, 0, 0)  # matplotlib reads it when it sees an IPython module
        shown.display = lambda *objects, **_: [print(repr(o)) for o in objects] and None
        ipython.display = shown
        sys.modules.update({"IPython": ipython, "IPython.display": shown})


def run_here(notebook: Path) -> dict:
    """Run every code cell of ``notebook`` in this process; what happened, as a dict."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    _stand_in_for_ipython()
    sys.path[0] = ""  # as in a kernel: the working directory (the notebook's folder) first,
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # then the course, installed or not
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    ran, skipped = 0, []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        name = f"<{notebook.name} cell {index}>"
        linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
        try:
            exec(compile(source, name, "exec"), namespace)  # noqa: S102 - the notebook's own code
        except ModuleNotFoundError as error:
            if (error.name or "").split(".")[0] not in NEEDS_JUPYTER:
                return _failure(index, error, ran, skipped)
            skipped.append(index)
        except BaseException as error:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are failures too
            return _failure(index, error, ran, skipped)
        ran += 1
    return {"passed": True, "cells": ran, "skipped": skipped}


def _failure(index: int, error: BaseException, ran: int, skipped: list[int]) -> dict:
    last = traceback.format_exception(error)[-1].strip()
    return {"passed": False, "cells": ran, "skipped": skipped, "cell": index, "error": last[:600]}


def run_in_a_fresh_process(notebook: Path, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, __file__, "--here", str(notebook.resolve())], cwd=notebook.parent,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"passed": False, "error": f"did not finish within {timeout:g} s", "seconds": timeout}
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    result = (json.loads(lines[-1][len(RESULT):]) if lines else
              {"passed": False, "error": f"the process ended ({done.returncode}) without a result: "
                                         f"{done.stderr.strip()[-600:]}"})
    result["seconds"] = time.perf_counter() - started
    return result


def describe(notebook: Path, result: dict) -> str:
    skipped = f", {len(result['skipped'])} skipped (need Jupyter: cells {result['skipped']})" if result.get(
        "skipped") else ""
    if result["passed"]:
        return f"passed  {notebook}: {result['cells']} code cells{skipped} ({result['seconds']:.0f} s)"
    where = f"cell {result['cell']}: " if "cell" in result else ""
    return f"FAILED  {notebook}: {where}{result['error']}{skipped} ({result['seconds']:.0f} s)"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per notebook (default 1200)")
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the child's side
    options = parser.parse_args(argv)
    if options.here:
        print(RESULT + json.dumps(run_here(options.notebooks[0])), flush=True)
        return 0
    failed = 0
    for notebook in options.notebooks:
        result = run_in_a_fresh_process(notebook, options.timeout)
        failed += not result["passed"]
        print(describe(notebook, result), flush=True)
    print(f"{len(options.notebooks) - failed} of {len(options.notebooks)} notebooks passed (plain Python, "
          "outputs not compared)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
