"""Every chapter keeps its tensors on one device when a GPU is there, checked without a GPU.

On a machine with one GPU, ``rank_device()`` gives ``cuda:0`` to a process alone on it: the
notebook kernel itself, or a one-rank launch (the ranks of a bigger launch all run on the CPU).
A chapter that moves its batches with ``.to(rank_device())`` but leaves the model they meet on the
CPU passes on every CPU-only machine and fails on that one ("Expected all tensors to be on the
same device ... cuda:0 ... cpu"), as chapter 08 once did.

CI has no GPU, so here the meta device stands in for it (``COURSE_FAKE_DEVICE=meta``, a test-only
switch in course_lib.launcher): every lesson and solution that calls ``rank_device()`` runs its
cells in a fresh IPython shell (the notebook kernel's side) whose ``rank_device()`` is ``meta``.
Any operation that mixes a tensor on that device with one left on the CPU raises, as it would on
the GPU, and the test fails with the cell (numbered as in the notebook's JSON, from 0) and the
message. The cells run are those whose code reaches ``rank_device()`` (directly, or through a
name bound from it: a function that calls it, a batch moved with it, ...) and the cells that
define what those use; the others never leave the CPU (and take most of the time).

What it does not run: the launches (``launch`` returns a placeholder per rank here, and a grader's
launch raises). On a one-GPU machine the ranks of a many-rank launch run on the CPU, as in CI,
where the rest of the suite runs them; a cell that uses a launch's results is checked up to where
it needs a value. Meta tensors hold no values, so reading one (``.item()``, ``.cpu()``) gives a
placeholder (1, or zeros), and autocast takes the CPU's rules for meta, which lets a cell go on to
its next operation; the chapters' own checks then fail on those values, and any error that is not
about devices only marks the rest of that cell as not checked.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])

# What torch says when one operation meets tensors on two devices (CUDA's, meta's, assert_close's).
CROSS_DEVICE = re.compile(r"Expected all tensors to be on the same device|is not on the expected device"
                          r"|'device' do not match|on the same device|are on different devices")


def _code_cells(path: Path) -> list[tuple[int, str]]:
    cells = json.loads(path.read_text())["cells"]
    return [(index, "".join(cell["source"])) for index, cell in enumerate(cells) if cell["cell_type"] == "code"]


def _python(source: str) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def _stored_names(statement) -> set[str]:
    """Top-level names a statement binds (a def's own name; not the names inside its body)."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name}
    names, todo = set(), [statement]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)  # defined inside an if, a with, ...
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return names


def _used_names(node) -> set[str]:
    """The names a statement reads from outside: less its loop variables (fresh values, whatever
    they were before) and, inside a function, its parameters and local variables."""
    used = set().union(set(), *map(_used_names, ast.iter_child_nodes(node)))
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        used.add(node.id)
    elif isinstance(node, ast.Attribute):
        used.add(node.attr)
    elif isinstance(node, (ast.For, ast.comprehension)):
        used -= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        arguments = node.args
        local = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                 *filter(None, [arguments.vararg, arguments.kwarg])]}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        used -= local
    return used


def _device_cells(cells: list[tuple[int, str]]) -> set[int]:
    """The cells to run: those whose code reaches rank_device(), directly or through a name bound
    from it (a function that calls it, a model moved with it, ...), and the cells that define what
    those use. The other cells never leave the CPU (the rest of the suite runs them)."""
    reaching, chosen, parsed = {"rank_device"}, set(), {}
    for index, source in cells:
        try:
            parsed[index] = ast.parse(_python(source))
        except SyntaxError:
            chosen.add(index)
            continue
        for statement in parsed[index].body:
            if _used_names(statement) & reaching:
                chosen.add(index)
                reaching |= _stored_names(statement) - {"rank_device"}
            else:  # bound again, to something that never saw the device
                reaching -= _stored_names(statement) - {"rank_device"}
    needed = set()
    for index, _ in reversed(cells):  # what the chosen cells use, back to where it is defined
        if index not in parsed:
            continue
        if index in chosen or set().union(set(), *map(_stored_names, parsed[index].body)) & needed:
            chosen.add(index)
            needed |= _used_names(parsed[index])
    return chosen


def _calls_rank_device(path: Path) -> bool:
    return any("rank_device()" in source for _, source in _code_cells(path))


CHECKED = [path for path in NOTEBOOKS if _calls_rank_device(path)]


# --------------------------------------------------------------------------
# The driver: run in a fresh interpreter, one notebook per run
# --------------------------------------------------------------------------
def _drive(path: Path) -> dict:
    os.environ["COURSE_FAKE_DEVICE"] = "meta"
    os.environ["MPLBACKEND"] = "Agg"
    import contextlib
    import io

    import torch
    from IPython.core.interactiveshell import InteractiveShell
    from torch.utils._python_dispatch import TorchDispatchMode

    import course_lib
    import course_lib.launcher as launcher

    class NotRun:
        # What a launch returns here, per rank: anything read from it is NotRun too, so that the
        # rest of the cell (the kernel's own references, often) still runs up to where a value is needed.
        def __getattr__(self, name):
            return self

        def __getitem__(self, key):
            return self

        def __call__(self, *args, **kwargs):
            return self

        def __iter__(self):
            return iter(())

        def __bool__(self):
            return False

        def __format__(self, spec):
            return "(not run)"

    def no_launch(fn, world_size=4, *args, **kwargs):
        return [NotRun() for _ in range(world_size)]

    def no_judged_launch(*args, **kwargs):  # a grader's launch: nothing to compare without its ranks
        raise RuntimeError("launches are not run by this test")

    course_lib.launch = launcher.launch = no_launch
    launcher._launch = no_judged_launch

    aten = torch.ops.aten

    class MetaValues(TorchDispatchMode):
        # Reading a meta tensor's values: a placeholder instead of an error, so the cell goes on.
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if func is aten._local_scalar_dense.default and tensors[0].is_meta:
                return True if tensors[0].dtype == torch.bool else 1
            if func is aten._to_copy.default and tensors[0].is_meta and kwargs.get("device") is not None \
                    and torch.device(kwargs["device"]).type != "meta":
                dtype = kwargs.get("dtype") or tensors[0].dtype
                return torch.zeros(tensors[0].shape, dtype=dtype, device=kwargs["device"])
            if func is aten.equal.default and any(t.is_meta for t in tensors):
                if not all(t.is_meta for t in tensors):  # as torch.equal says on CUDA
                    raise RuntimeError("Expected all tensors to be on the same device, but found "
                                       f"{sorted({str(t.device) for t in tensors})}")
                return True
            if func is aten.nonzero.default and tensors[0].is_meta:
                return torch.zeros((0, tensors[0].dim()), dtype=torch.long, device="meta")
            if func is aten.copy_.default and tensors[1].is_meta and not tensors[0].is_meta:
                return tensors[0]  # a copy to another device is legal on a GPU; the values stay
            return func(*args, **kwargs)

    class Autocast(torch.autocast):
        # Autocast has no meta device: the CPU's stands in (it casts nothing on meta tensors, so a
        # chapter's dtype checks fail here, but the cell goes on to its next operation).
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    torch.autocast = torch.amp.autocast = Autocast
    shell = InteractiveShell.instance()
    os.chdir(path.parent)
    report = {"kernel_device": str(launcher.rank_device()), "cells": []}
    cells = _code_cells(path)
    chosen = _device_cells(cells)
    with MetaValues():
        for index, source in cells:
            if index not in chosen:
                report["cells"].append({"cell": index, "seconds": 0, "error": None, "skipped": True})
                continue
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                result = shell.run_cell(source, store_history=False, silent=True)
            error = result.error_in_exec or result.error_before_exec
            report["cells"].append({
                "cell": index, "seconds": round(time.perf_counter() - started, 2),
                "error": None if error is None else f"{type(error).__name__}: {error}"})
    return report


def _run_driver(path: Path, timeout: float = 240) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="devices_ipython_") as ipython_dir:  # not the user's profile
        env = {**os.environ, "COURSE_FAKE_DEVICE": "meta", "PYTHONPATH": str(ROOT), "IPYTHONDIR": ipython_dir}
        env.pop("COURSE_START_METHOD", None)
        done = subprocess.run([sys.executable, __file__, str(path)], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, f"the driver failed on {path.name}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cross_device_errors(report: dict) -> list[str]:
    return [f"cell {c['cell']}: {c['error'].splitlines()[0][:300]}" for c in report["cells"]
            if c["error"] and CROSS_DEVICE.search(c["error"])]


# --------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------
def test_the_stand_in_follows_the_one_gpu_rule(monkeypatch):
    import torch

    from course_lib.launcher import rank_device

    monkeypatch.setenv("COURSE_FAKE_DEVICE", "meta")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert rank_device() == torch.device("meta")  # the kernel: alone on the machine
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert rank_device() == torch.device("meta")  # a one-rank launch
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert rank_device() == torch.device("cpu")   # 4 ranks, one GPU: all on the CPU


def test_the_stand_in_catches_a_reference_left_on_the_cpu(tmp_path):
    # Chapter 08's old bug in three lines: the batch follows rank_device(), the model does not.
    cells = [
        "import torch, torch.nn as nn\nfrom course_lib.launcher import rank_device\nmodel = nn.Linear(4, 2)",
        "x = torch.randn(3, 4).to(rank_device())\nloss = model(x).sum()",
        "model = model.to(rank_device())\nloss = model(x).sum()\nprint(f'{loss.item():.3f}', loss.cpu())",
    ]
    notebook = {"cells": [{"cell_type": "code", "source": source, "metadata": {}, "outputs": [],
                           "execution_count": None} for source in cells],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "bug.ipynb"
    path.write_text(json.dumps(notebook))
    report = _run_driver(path)
    assert report["kernel_device"] == "meta"
    assert [bool(c["error"]) for c in report["cells"]] == [False, True, False], report
    assert _cross_device_errors(report) == [f"cell 1: {report['cells'][1]['error'].splitlines()[0]}"]


def _asks_for_cuda(tree) -> bool:
    """A device "cuda" or "cuda:N" given to a call, or a `.cuda()` call (not torch.cuda's questions)."""
    compared = {id(node) for compare in ast.walk(tree) if isinstance(compare, ast.Compare)
                for node in ast.walk(compare)}  # "cuda" in str(exc): text, not a device
    return any((isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in compared
                and re.fullmatch(r"cuda(:\d+)?", node.value))
               or (isinstance(node, ast.Attribute) and node.attr == "cuda"
                   and not (isinstance(node.value, ast.Name) and node.value.id == "torch"))
               for node in ast.walk(tree))


def test_the_chapters_not_checked_here_stay_on_the_cpu():
    # A chapter that never calls rank_device() runs on the CPU, except in cells that ask torch.cuda
    # first whether the GPUs they need are there.
    assert {p.name for p in CHECKED if p.parent.name == "notebooks"} >= {
        "00_preflight.ipynb", "03_ddp.ipynb", "06_mixed_precision.ipynb", "07_accumulation_large_batch.ipynb",
        "08_zero_fsdp.ipynb"}
    unguarded = [f"{path.parent.name}/{path.name} cell {index}"
                 for path in NOTEBOOKS if path not in CHECKED for index, source in _code_cells(path)
                 if _asks_for_cuda(ast.parse(_python(source)))
                 and not re.search(r"torch\.cuda\.(is_available|device_count)\(\)", source)]
    assert not unguarded, f"cells that put tensors on a GPU without asking whether there is one: {unguarded}"


@pytest.fixture(scope="module")
def reports():
    # Two notebooks at a time: most of a driver's time is starting (imports), on one core.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CHECKED, pool.map(_run_driver, CHECKED)))


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_cell_mixes_devices_with_a_gpu_present(path, reports):
    report = reports[path]
    assert report["kernel_device"] == "meta"
    errors = _cross_device_errors(report)
    assert not errors, (f"{path.parent.name}/{path.name} mixes devices where a GPU is present: a tensor on "
                        "rank_device() meets one on the CPU (move both with rank_device(), or keep both on the "
                        "CPU and say why):\n" + "\n".join(errors))
    ran = [c["cell"] for c in report["cells"] if not c.get("skipped") and not c["error"]]
    assert ran, f"no cell of {path.name} ran to its end here: {report['cells']}"


if __name__ == "__main__":
    print(json.dumps(_drive(Path(sys.argv[1]).resolve())))


def test_the_gpu_check_says_when_there_is_no_gpu():
    # scripts/gpu_check.py is for a maintainer with a GPU; without one it must say so and pass.
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("no GPU: nothing checked"), done.stdout
