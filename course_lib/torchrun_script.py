"""Write a notebook function out as a script that ``torchrun`` runs (chapter 00; used from chapter 04).

The functions in this course read their rank and world size from ``torch.distributed``
and the torchrun environment variables, so the same body runs under ``launch`` in a
notebook and under ``torchrun`` on a cluster. This module writes that script::

    write_torchrun_script(train, "train.py", args=(3,), preamble="import torch\\n...")
    # then, in a terminal:  torchrun --standalone --nproc-per-node=4 train.py
"""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

DEFAULT_PREAMBLE = "import os\nimport torch\nimport torch.distributed as dist\n"

_MAIN = r'''

if __name__ == "__main__":
    # torchrun has set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT: env:// reads them.
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]) else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    try:
        result = {name}(*{args!r})
        # One write per line, so the ranks' lines don't interleave on a shared terminal.
        os.write(1, f"[rank {{dist.get_rank()}}] returned {{result!r}}\n".encode())
    finally:
        dist.destroy_process_group()
'''


def write_torchrun_script(fn, path, args=(), preamble: str = DEFAULT_PREAMBLE) -> Path:
    """Write ``fn``'s source, ``preamble`` (its imports) and a torchrun entry point to ``path``.

    ``args`` must be literals (numbers, strings, lists...): they are written into the script.
    """
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise TypeError(f"cannot read the source of {fn!r} ({exc}); define it with `def` in a file or a cell") from None
    if "<lambda>" in getattr(fn, "__name__", ""):
        raise TypeError("a lambda has no name to call from a script; define the function with `def`")
    for value in args:
        try:
            ok = eval(repr(value), {}) == value  # noqa: S307 - checking that repr round-trips
        except Exception:  # noqa: BLE001
            ok = False
        if not ok:
            raise TypeError(f"argument {value!r} cannot be written into a script; pass literals only")
    path = Path(path)
    path.write_text(
        f"# {path.name}: `{fn.__name__}` from the course, as a script.\n"
        f"# Run it with:  torchrun --standalone --nproc-per-node=4 {path.name}\n"
        + preamble + "\n\n" + source + _MAIN.format(name=fn.__name__, args=tuple(args))
    )
    return path
