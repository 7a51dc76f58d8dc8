"""The course's claim "this cell runs unchanged under torchrun", checked for every cell that makes it.

A lesson marks a code cell whose first line is exactly ``# runs unchanged under torchrun``.
For each such cell this test defines the cell's functions (with the imports, functions,
classes and literal constants of the cells before it, none of which is run), then runs every
function that takes no required arguments twice through ``launch`` and once under
``torchrun --standalone`` (through the script ``course_lib.torchrun_script`` writes), and
compares the results. Values that differ between the two ``launch`` runs (a pid, a port) are
run-specific and not compared; everything else must be equal.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from course_lib.launcher import launch, threads_per_rank
from course_lib.torchrun import run_torchrun
from course_lib.torchrun_script import function_calls_init_process_group

REPO = Path(__file__).resolve().parents[1]
MARK = "# runs unchanged under torchrun"
WORLD_SIZE = 4  # the course's default world size
MISSING = object()


def _code(cell) -> str:
    source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
    # IPython magics and shell escapes are not Python
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def marked_cells() -> list[tuple[str, int]]:
    found = []
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        for index, cell in enumerate(cells):
            if cell["cell_type"] == "code" and _code(cell).split("\n", 1)[0].rstrip() == MARK:
                found.append((notebook.name, index))
    return found


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _definitions(source: str, where: str) -> list[str]:
    """A cell's imports, defs, classes and literal constants, as source (nothing else runs)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise AssertionError(f"{where} is not valid Python: {exc}") from None
    keep = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)) or (
                isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _is_literal(node.value)):
            keep.append(ast.get_source_segment(source, node, padded=False))
    return keep


def load_cell(notebook: str, index: int, folder: Path, notebooks: Path = REPO / "notebooks"):
    """The marked cell's module (defined after the earlier cells' definitions) and its function names."""
    cells = json.loads((notebooks / notebook).read_text())["cells"]
    pieces = []
    for i, cell in enumerate(cells[: index + 1]):
        if cell["cell_type"] == "code":
            pieces += _definitions(_code(cell), f"{notebook} cell {i}")
    tree = ast.parse(_code(cells[index]))
    names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]
    name = f"claim_{Path(notebook).stem}_cell{index}"
    path = folder / f"{name}.py"
    path.write_text("\n\n".join(pieces) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)  # the workers need not import it
    return module, names


def _compare(from_torchrun, first_launch, second_launch, where: str) -> None:
    """Equal, except where the two launches themselves disagree (pids, ports)."""
    if isinstance(first_launch, torch.Tensor):
        if isinstance(second_launch, torch.Tensor) and second_launch.shape == first_launch.shape and \
                not torch.equal(first_launch, second_launch):
            return
        torch.testing.assert_close(from_torchrun, first_launch, msg=lambda m: f"{where}: {m}")
    elif isinstance(first_launch, dict):
        assert isinstance(from_torchrun, dict) and from_torchrun.keys() == first_launch.keys(), \
            f"{where}: torchrun returned {from_torchrun!r}, launch {first_launch!r}"
        for key in first_launch:
            _compare(from_torchrun[key], first_launch[key], second_launch.get(key, MISSING), f"{where}[{key!r}]")
    elif isinstance(first_launch, (list, tuple)):
        assert isinstance(from_torchrun, (list, tuple)) and len(from_torchrun) == len(first_launch), \
            f"{where}: torchrun returned {from_torchrun!r}, launch {first_launch!r}"
        seconds = second_launch if isinstance(second_launch, (list, tuple)) and \
            len(second_launch) == len(first_launch) else [MISSING] * len(first_launch)
        for i, (a, b, c) in enumerate(zip(from_torchrun, first_launch, seconds)):
            _compare(a, b, c, f"{where}[{i}]")
    elif first_launch != second_launch and second_launch is not MISSING:
        return  # run-specific: differs from one launch to the next
    elif isinstance(first_launch, float):
        assert from_torchrun == pytest.approx(first_launch, rel=1e-5, abs=1e-6), \
            f"{where}: torchrun returned {from_torchrun!r}, launch {first_launch!r}"
    else:
        assert from_torchrun == first_launch, f"{where}: torchrun returned {from_torchrun!r}, launch {first_launch!r}"


CELLS = marked_cells()


def test_the_scan_finds_the_marked_cells():
    assert all(nb.endswith(".ipynb") for nb, _ in CELLS)
    if not CELLS:
        pytest.skip("no notebook cell claims to run unchanged under torchrun")


def test_a_marked_cell_that_is_not_ready_fails_loudly(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from course_lib.torchrun_script import write_torchrun_script

    cells = [new_code_cell("import torch\nWEIGHTS = torch.ones(3)  # a tensor made in the notebook"),
             new_code_cell(MARK + "\ndef uses_notebook_state():\n    return WEIGHTS * 2\n")]
    nbformat.write(new_notebook(cells=cells), tmp_path / "fake.ipynb")
    module, names = load_cell("fake.ipynb", 1, tmp_path, notebooks=tmp_path)
    assert names == ["uses_notebook_state"]
    module.WEIGHTS = __import__("torch").ones(3)  # what running the first cell would have made
    with pytest.raises(TypeError, match="WEIGHTS.*pass it in through args"):
        write_torchrun_script(module.uses_notebook_state, tmp_path / "x.py")


@pytest.mark.parametrize(("notebook", "index"), CELLS, ids=[f"{nb}-cell{i}" for nb, i in CELLS])
def test_marked_cell_runs_unchanged_under_torchrun(notebook, index, tmp_path, monkeypatch):
    module, names = load_cell(notebook, index, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ready = []
    for name in names:
        fn = getattr(module, name)
        required = [p for p in inspect.signature(fn).parameters.values()
                    if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not required:
            ready.append(fn)
    assert ready, (f"{notebook} cell {index} says it runs unchanged under torchrun but defines no function "
                   f"that takes no required arguments (found: {names or 'no functions'})")
    for fn in ready:
        where = f"{notebook} cell {index}: {fn.__name__}()"
        own_init = function_calls_init_process_group(fn)
        launched = [launch(fn, WORLD_SIZE, timeout=120, init_process_group=not own_init, show_output=False,
                           live=False) for _ in range(2)]
        # the same intra-op thread count as launch gives each rank (torchrun would set 1)
        under_torchrun = run_torchrun(fn, WORLD_SIZE, timeout=240, show_output=False,
                                      env={"OMP_NUM_THREADS": str(threads_per_rank(WORLD_SIZE))},
                                      script=tmp_path / f"{fn.__name__}.py")
        _compare(under_torchrun, launched[0], launched[1], where)
