"""The ranks' progress, shown in the notebook while a launch runs: each rank's latest lines, or
per-rank progress bars once a rank calls ``report_progress``.

Introduced in chapter 00 (preflight); ``report_progress`` is first called in chapter 03 (DDP).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from .output import _read_text

_LIVE_REFRESH_S = 0.5
# A quick run's bars would flash for a fraction of a second (and a busy browser might never
# draw them): once shown, they stay at least this long, at their final values.
_BARS_SHOWN_AT_LEAST_S = 1.5
# Where report_progress writes, in each rank (set by the worker, read by _LiveView).
_PROGRESS_FILE_VARIABLE = "COURSE_PROGRESS_FILE"
# What a live display holds before its first update and after its last: no data at all, not an empty
# text. nbval compares every output that has data, and a cell whose check may launch once more on a busy
# machine would then store one count of empty displays and show another; an output with no data is
# compared by no one, and a frontend draws nothing for it.
_NOTHING: dict = {}


def report_progress(step: int, total: int) -> None:
    """From inside fn: "this rank has done ``step`` of ``total``" (drawn as a live progress bar).

    Outside a launch it does nothing, so the same function also runs under torchrun.
    """
    path = os.environ.get(_PROGRESS_FILE_VARIABLE)
    if not path:
        return
    with contextlib.suppress(OSError):
        with open(path + ".tmp", "w") as f:
            f.write(f"{int(step)} {int(total)}")
        os.replace(path + ".tmp", path)


def _in_notebook_kernel() -> bool:
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class _LiveView:
    """Shows the ranks' progress in one notebook display while a launch runs.

    Text (each rank's latest lines) by default; per-rank progress bars once a rank calls
    ``report_progress``. The bars are HTML ``<progress>`` elements, not widgets: a frontend draws
    them in the same step as the message that brings them (a widget view is built asynchronously
    after its model, so a busy browser could be told to clear the bars before drawing them), and
    they need no widget extension. The display is emptied at the end, so the stored cell output
    holds only the ordered transcript printed afterwards.
    """

    def __init__(self, enabled: bool, world_size: int, show_lines: bool = True):
        self.handle = None
        self.show_lines = show_lines  # False: a launch whose output is not shown shows only its time and bars
        self.bars_since = None
        self.world_size = world_size
        self.last = 0.0
        if not enabled or not _in_notebook_kernel():
            return
        from IPython.display import display

        self.handle = display(_NOTHING, raw=True, display_id=True)

    def update(self, started, out_paths, progress_paths):
        if self.handle is None or time.monotonic() - self.last < _LIVE_REFRESH_S:
            return
        self.last = time.monotonic()
        progress = [_read_progress(path) for path in progress_paths]
        if any(progress):
            self._show_bars(progress)
            return
        lines = [f"running for {time.monotonic() - started:.0f} s ..."]
        for rank, path in enumerate(out_paths if self.show_lines else []):
            tail = _read_text(path).splitlines()[-2:]
            lines += [f"[rank {rank}] {line}" for line in tail]
        self.handle.update({"text/plain": "\n".join(lines)}, raw=True)

    def _show_bars(self, progress) -> None:
        self.handle.update(_progress_bars(progress), raw=True)
        self.bars_since = self.bars_since or time.monotonic()

    def finish(self, progress_paths):
        """After a successful launch: the bars at their final values, on screen long enough to see."""
        if self.handle is None:
            return
        progress = [_read_progress(path) for path in progress_paths]
        if any(progress):
            self._show_bars(progress)
            time.sleep(max(0.0, self.bars_since + _BARS_SHOWN_AT_LEAST_S - time.monotonic()))

    def close(self):
        if self.handle is not None:
            self.handle.update(_NOTHING, raw=True)


class StatusLine:
    """One line shown while something with no ranks of the launcher's own runs (torchrun agents, a
    Slurm job, a training in the kernel), so a cell that waits tens of seconds is never silent; emptied
    at the end like the launch's view, so the stored output holds only what the cell prints. Outside a
    notebook it shows nothing. Introduced in chapter 04 (torchrun, Slurm); chapter 06 shows its epochs::

        with StatusLine("training fp8") as status:
            for epoch in range(10):
                status.show(f"epoch {epoch + 1} of 10")   # at most twice a second
    """

    def __init__(self, what: str):
        self.what, self.started, self.last, self.handle = what, time.monotonic(), 0.0, None
        if _in_notebook_kernel():
            from IPython.display import display

            self.handle = display(_NOTHING, raw=True, display_id=True)

    def show(self, state: str = "") -> None:
        if self.handle is None or time.monotonic() - self.last < _LIVE_REFRESH_S:
            return
        self.last = time.monotonic()
        detail = f": {state}" if state else ""
        self.handle.update({"text/plain": f"{self.what}, {time.monotonic() - self.started:.0f} s{detail} ..."},
                           raw=True)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.update(_NOTHING, raw=True)

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _progress_bars(progress) -> dict[str, str]:
    """One row per rank, "rank r [bar] step / total", as HTML and as text (for a plain frontend).
    A rank that has not reported yet shows an indeterminate bar ("waiting")."""
    html, text = [], []
    for rank, state in enumerate(progress):
        if state is None:
            bar, words, filled = '<progress max="1" style="width: 20em"></progress>', "waiting", 0
        else:
            step, total = state
            done, width = min(max(step, 0), max(total, 1)), max(total, 1)
            bar = f'<progress value="{done}" max="{width}" style="width: 20em"></progress>'
            words, filled = f"{step} / {total}", round(20 * done / width)
        html.append(f"<div><code>rank {rank}</code> {bar} <code>{words}</code></div>")
        text.append(f"rank {rank} [{'#' * filled}{'.' * (20 - filled)}] {words}")
    return {"text/html": "\n".join(html), "text/plain": "\n".join(text)}


def _read_progress(path: str):
    text = _read_text(path).split()
    if len(text) == 2 and all(part.lstrip("-").isdigit() for part in text):
        return int(text[0]), int(text[1])
    return None
