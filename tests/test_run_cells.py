"""scripts/run_cells.py: the notebooks' code cells in plain Python, for a GPU machine without Jupyter."""

import json
import subprocess
import sys
from pathlib import Path

RUN_CELLS = Path(__file__).resolve().parents[1] / "scripts" / "run_cells.py"


def notebook(tmp_path: Path, name: str, *cells: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["# a title\n"], "metadata": {}},
        *({"cell_type": "code", "source": [source], "metadata": {}, "outputs": []} for source in cells)]}))
    return path


def run(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN_CELLS), *map(str, paths)], capture_output=True, text=True,
                          timeout=120)


def test_cells_share_a_namespace_and_their_source_is_readable(tmp_path):
    good = notebook(tmp_path, "good.ipynb",
                    "def twice(x):\n    return 2 * x\n",
                    "import inspect, os\nassert 'return 2 * x' in inspect.getsource(twice)\n"
                    "assert os.getcwd() == " + repr(str(tmp_path)) + "\nassert __name__ == '__main__'\n",
                    "import sys\nsys.modules['ipywidgets'] = None  # as on a machine without it\n",
                    "import ipywidgets\n",
                    "assert twice(2) == 4\n")
    done = run(good)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "passed  " in done.stdout and "5 code cells, 1 skipped (need Jupyter: cells [4])" in done.stdout


def test_the_first_failing_cell_is_named_and_the_run_fails(tmp_path):
    bad = notebook(tmp_path, "bad.ipynb", "x = 1\n", "raise ValueError('a wrong device')\n", "x = 2\n")
    good = notebook(tmp_path, "good.ipynb", "x = 1\n")
    done = run(bad, good)
    assert done.returncode == 1
    assert "FAILED  " in done.stdout and "cell 2: ValueError: a wrong device" in done.stdout
    assert "1 of 2 notebooks passed" in done.stdout
