"""Write a notebook function out as a script that ``torchrun`` runs (chapter 00; reworked in chapter 04).

The functions in this course read their rank and world size from ``torch.distributed``
and the torchrun environment variables, so the same body runs under ``launch`` in a
notebook and under ``torchrun`` on a cluster. This module writes that script::

    write_torchrun_script(train, "train.py", args=(3,))
    # then, in a terminal:  torchrun --standalone --nproc-per-node=4 train.py

What a notebook function really uses travels with it:

* the modules it names (``torch``, ``dist``, ``nn`` ...) become imports;
* functions and classes from importable modules (``course_lib``, ``torch``) become imports;
* functions and classes defined in the notebook are copied, with what *they* use;
* module-level constants (numbers, strings, tuples, lists, dicts of those, dtypes) are copied.

Anything else (a tensor, a model, an open file in a global) raises a ``TypeError`` that says
to pass it through ``args`` instead. ``args`` that are literals are written into the script;
others (tensors, for example) go into ``<script>.args.pt`` next to it.

A function that calls ``dist.init_process_group`` itself is left to do so; otherwise the
script initialises the default group: gloo for CPU tensors and, when each process has a GPU
of its own, NCCL for CUDA tensors on it (``cuda:LOCAL_RANK`` when every process sees all of the
node's GPUs, ``cuda:0`` when each sees only its own). The script prints each rank's return value, or,
when ``course_lib.torchrun`` runs it, saves it so the notebook gets it back.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import inspect
import sys
import textwrap
import types
from pathlib import Path

import torch

# Kept for callers that pass their own imports; the writer now finds the imports itself.
DEFAULT_PREAMBLE = "import os\nimport torch\nimport torch.distributed as dist\n"

_ENTRY = r'''

# ---------------------------------------------------------------- written by course_lib: the entry point
def _gpu_of_this_rank():
    """This rank's GPU index, or None (no GPU of its own: the CPU and gloo).

    NCCL needs one GPU per rank. A launcher gives each rank its GPU in one of two ways:
    every rank sees all of the node's GPUs and takes cuda:LOCAL_RANK (torchrun's default), or
    each rank sees only its own, as cuda:0 (CUDA_VISIBLE_DEVICES set per rank: srun
    --gpus-per-task=1, torchrun --virtual-local-rank).
    """
    import os
    import torch

    if not torch.cuda.is_available():
        return None
    visible = torch.cuda.device_count()
    if visible >= int(os.environ["LOCAL_WORLD_SIZE"]):  # all of the node's GPUs
        return int(os.environ["LOCAL_RANK"])
    if visible == 1 and os.environ.get("CUDA_VISIBLE_DEVICES"):  # this rank's own GPU only
        return 0
    return None  # fewer GPUs than ranks, all visible to all: the ranks would have to share them


def _course_entry():
    import os
    import torch
    import torch.distributed as _dist

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    collect = os.environ.get("COURSE_TORCHRUN_OUTPUT")  # set by course_lib.torchrun, not by you
    if collect:  # one output file per rank and attempt, so the notebook can show them in rank order
        for fd, stream in ((1, "out"), (2, "err")):
            target = os.open(os.path.join(collect, f"rank{{rank}}.attempt{{attempt}}.{{stream}}"),
                             os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(target, fd)
        with open(os.path.join(collect, f"pid.{{os.getpid()}}"), "w") as note:
            note.write(__file__)
    if {initialise!r}:  # {why}
        # torchrun has set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the env:// method reads them.
        gpu = _gpu_of_this_rank()
        if gpu is not None:
            torch.cuda.set_device(gpu)  # NCCL works on the current device
        _dist.init_process_group("cpu:gloo,cuda:nccl" if gpu is not None else "gloo")
    try:
        result = {name}(*{args})
        if _dist.is_available() and _dist.is_initialized():
            # every rank reaches this point before any rank tears the group down: a rank that
            # finished first would otherwise close connections its peers are still setting up
            _dist.barrier()
        if collect:
            partial = os.path.join(collect, f"result{{rank}}.pt.partial")
            torch.save(result, partial)
            os.replace(partial, os.path.join(collect, f"result{{rank}}.pt"))
        else:  # one write per line, so the ranks' lines don't interleave on a shared terminal
            os.write(1, f"[rank {{rank}}] returned {{result!r}}\n".encode())
    finally:
        if _dist.is_available() and _dist.is_initialized():
            _dist.destroy_process_group()


if __name__ == "__main__":
    _course_entry()
'''

_LITERAL_TYPES = (int, float, complex, str, bytes, bool, type(None))


def _is_literal(value, depth=0) -> bool:
    if depth > 20:
        return False
    if isinstance(value, _LITERAL_TYPES):
        if isinstance(value, float) and value != value:  # nan does not equal itself
            return False
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_is_literal(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(k, depth + 1) and _is_literal(v, depth + 1) for k, v in value.items())
    return False


def _is_builtin(name: str, value) -> bool:
    """True for a builtin, or a wrapper of one: IPython binds its own ``open`` in a notebook's globals."""
    builtin = vars(builtins).get(name)
    if builtin is None:
        return False
    with contextlib.suppress(Exception):
        return value is builtin or inspect.unwrap(value) is builtin
    return False


def _source_of(obj) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError) as exc:
        raise TypeError(f"cannot read the source of {obj!r} ({exc}); define it with `def` or `class` "
                        "in a notebook cell or a file") from None


def _importable(module_name: str | None) -> bool:
    return bool(module_name) and module_name != "__main__" and module_name in sys.modules and \
        getattr(sys.modules[module_name], "__file__", None) is not None


def _code_names(code: types.CodeType) -> set[str]:
    """The global (or attribute) names a code object and the code nested in it look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _names(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def _bound_names(tree: ast.AST) -> set[str]:
    bound = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    bound |= {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    return bound


class _Collector:
    """Walks from a function to every global it uses and writes each as script text."""

    def __init__(self, home_module: str | None):
        self.home = home_module  # the function's own module: its definitions are copied
        self.imports: list[str] = []
        self.constants: list[str] = []
        self.definitions: list[str] = []
        self.sources: list[str] = []  # copied source, scanned for init_process_group
        self.done: set[tuple[str, int]] = set()

    def _add(self, bucket: list[str], line: str) -> None:
        if line not in bucket:
            bucket.append(line)

    def copy_definition(self, obj) -> None:
        key = (getattr(obj, "__qualname__", repr(obj)), id(obj))
        if key in self.done:
            return
        self.done.add(key)
        source = _source_of(obj)
        self.definitions.append(source)
        self.sources.append(source)
        tree = ast.parse(source)
        if isinstance(obj, types.FunctionType):
            globs = obj.__globals__
            # names the source mentions that the compiled code looks up globally (not its locals)
            used = _names(tree) & _code_names(obj.__code__)
        else:  # a class: its module's globals, minus what the class itself binds
            globs = vars(sys.modules[obj.__module__]) if obj.__module__ in sys.modules else {}
            used = _names(tree) - _bound_names(tree)
        self.walk(used, globs)

    def walk(self, used: set[str], globs: dict) -> None:
        for name in sorted(used):
            if name not in globs or name.startswith("__") or _is_builtin(name, globs[name]):
                continue  # an attribute name, a builtin, or a local
            self.add_global(name, globs[name])

    def add_global(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType):
            module = value.__name__
            if module == name:
                self._add(self.imports, f"import {module}")
            elif "." in module and module.rsplit(".", 1)[1] == name:
                self._add(self.imports, f"from {module.rsplit('.', 1)[0]} import {name}")
            else:
                self._add(self.imports, f"import {module} as {name}")
            return
        if isinstance(value, (types.FunctionType, type)):
            module = getattr(value, "__module__", None)
            if module != self.home and _importable(module) and "<locals>" not in value.__qualname__:
                qualname = value.__qualname__
                if "." not in qualname and getattr(sys.modules[module], qualname, None) is value:
                    alias = "" if qualname == name else f" as {name}"
                    self._add(self.imports, f"from {module} import {qualname}{alias}")
                    return
            if value.__name__ != name:
                raise TypeError(f"the global `{name}` is `{value.__name__}` under another name; "
                                f"refer to it as `{value.__name__}`, or pass it in through args")
            self.copy_definition(value)
            return
        if callable(value) and _importable(getattr(value, "__module__", None)):
            # builtins implemented in C (math.sqrt, torch.tensor): import them by name
            module, qualname = value.__module__, getattr(value, "__qualname__", getattr(value, "__name__", ""))
            if getattr(sys.modules[module], qualname, None) is value:
                alias = "" if qualname == name else f" as {name}"
                self._add(self.imports, f"from {module} import {qualname}{alias}")
                return
        if isinstance(value, torch.dtype):
            self._add(self.imports, "import torch")
            self._add(self.constants, f"{name} = {value!r}")
            return
        if _is_literal(value):
            self._add(self.constants, f"{name} = {value!r}")
            return
        what = "a tensor" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
        raise TypeError(f"the function uses the notebook global `{name}`, {what}, which cannot be written "
                        f"into a script; create it inside the function or pass it in through args")


def _calls_init_process_group(sources: list[str]) -> bool:
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "init_process_group":
                    return True
    return False


def function_calls_init_process_group(fn) -> bool:
    """Whether ``fn`` (or a notebook helper it calls) initialises the default group itself."""
    collector = _Collector(getattr(fn, "__module__", None))
    collector.copy_definition(fn)
    return _calls_init_process_group(collector.sources)


def _args_text(args, path: Path) -> str:
    if all(_is_literal(value) for value in args):
        return repr(tuple(args))
    args_file = path.with_name(path.name + ".args.pt")
    try:
        torch.save(tuple(args), args_file)
    except Exception as exc:  # noqa: BLE001 - anything torch.save cannot pickle
        raise TypeError(f"the arguments {args!r} cannot be written into a script ({type(exc).__name__}: "
                        f"{exc}); pass literals (numbers, strings, lists) or tensors only") from None
    return f"torch.load(__file__ + '.args.pt', weights_only=False)"


def write_torchrun_script(fn, path, args=(), preamble: str | None = None) -> Path:
    """Write ``fn``, everything from the notebook it uses, and a torchrun entry point to ``path``.

    ``preamble``: extra lines to put at the top (the imports are found without it).
    """
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise TypeError(f"expected a function defined with `def`, got {fn!r}")
    if "<lambda>" in getattr(fn, "__name__", ""):
        raise TypeError("a lambda has no name to call from a script; define the function with `def`")
    for value in args:
        if not _is_literal(value):
            try:
                import pickle
                pickle.dumps(value)
            except Exception:  # noqa: BLE001
                raise TypeError(f"argument {value!r} cannot be written into a script; pass literals "
                                "(numbers, strings, lists) or tensors only") from None
    path = Path(path)
    collector = _Collector(getattr(fn, "__module__", None))
    collector.copy_definition(fn)
    initialise = not _calls_init_process_group(collector.sources)
    parts = [
        f"# {path.name}: `{fn.__name__}` from the course, as a script.\n"
        f"# Run it with:  torchrun --standalone --nproc-per-node=4 {path.name}\n",
        (preamble or "") + "\n".join(dict.fromkeys(["import os", "import torch", "import torch.distributed as dist",
                                                     *collector.imports])) + "\n",
    ]
    if collector.constants:
        parts.append("\n".join(collector.constants) + "\n")
    parts.extend("\n" + source for source in reversed(collector.definitions))
    parts.append(_ENTRY.format(name=fn.__name__, args=_args_text(args, path), initialise=initialise,
                              why="the script starts the default group" if initialise
                              else "the function calls init_process_group itself"))
    path.write_text("\n".join(parts))
    return path

