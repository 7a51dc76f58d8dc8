"""Run notebooks in JupyterLab in a real (headless) browser and read what a learner would see.

Used by tests/test_browser.py. JupyterLab is started from this environment on 127.0.0.1
with a free port and a known token; Chromium (Debian's package, or any Chromium given by
$COURSE_CHROMIUM) is driven by Playwright. What a run reports is read from the page's DOM,
not from the notebook file: cell prompts, rendered outputs, images, widgets.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

CHECK_PASSED, CHECK_FAILED = "\u2714", "\u2718"
LIVE_VIEW = re.compile(r"running for \d+ s \.\.\.")
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("COURSE_CHROMIUM"), shutil.which("chromium"),
                      shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def missing_requirements() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (make browser-deps installs it)"
    if chromium_path() is None:
        return "no Chromium found (Debian/Ubuntu: apt-get install chromium; or set COURSE_CHROMIUM)"
    return None


def _stop_when_parent_dies() -> None:
    """In the server's process before it starts (Linux): SIGTERM when the test process dies,
    even killed outright, so no JupyterLab and kernels are left behind by a killed test run."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving ``root``; stopped (with its kernels) on exit."""

    def __init__(self, root: Path, kernel_variants: dict[str, dict[str, str]] | None = None):
        self.root, self.port, self.token = root, _free_port(), secrets.token_hex(16)
        self.process = None
        self.kernel_variants = kernel_variants or {}

    def __enter__(self) -> "JupyterLab":
        command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
                   f"--port={self.port}", f"--IdentityProvider.token={self.token}",
                   f"--ServerApp.root_dir={self.root}", "--ServerApp.port_retries=0",
                   # its own workspace: no tabs restored from another lab or an earlier run
                   f"--LabApp.workspaces_dir={self.root / '.workspaces'}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.append("--allow-root")
        self.log = open(self.root / "jupyterlab.log", "w")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True, env=self._environment(),
                                        preexec_fn=_stop_when_parent_dies)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url('api/status')}", timeout=2)
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"JupyterLab did not start; its log:\n{(self.root / 'jupyterlab.log').read_text()}")

    def _environment(self) -> dict[str, str]:
        """The server's environment, with a kernel spec per variant (its own environment variables)."""
        env = dict(os.environ)
        if not self.kernel_variants:
            return env
        specs = self.root / ".kernels"
        for name, variables in self.kernel_variants.items():
            folder = specs / "kernels" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "kernel.json").write_text(json.dumps({
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"Python 3 ({name})", "language": "python", "env": variables}))
        env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(specs), env.get("JUPYTER_PATH")]))
        return env

    def use_kernel(self, name: str, variant: str) -> None:
        """Open notebook ``name`` (the lab's copy) with the kernel of ``variant``."""
        if variant not in self.kernel_variants:
            raise ValueError(f"no kernel variant {variant!r}; known: {sorted(self.kernel_variants)}")
        path = self.root / name
        notebook = json.loads(path.read_text())
        notebook.setdefault("metadata", {})["kernelspec"] = {
            "name": variant, "display_name": f"Python 3 ({variant})", "language": "python"}
        path.write_text(json.dumps(notebook, indent=1))

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def shut_down_kernels(self, timeout_s: float = 60) -> list[str]:
        """Stop every kernel the server runs, as a learner's "Shut Down All Kernels" does; return
        the ids of those still running at the timeout. A lesson's kernel and the launch server it
        started hold about 1.4 GB between them: left running, twelve lessons would hold most of a
        24 GB machine while the later ones run."""
        def running() -> list[str]:
            with urllib.request.urlopen(self.url("api/kernels"), timeout=10) as reply:
                return [kernel["id"] for kernel in json.load(reply)]

        for kernel_id in running():
            request = urllib.request.Request(self.url(f"api/kernels/{kernel_id}"), method="DELETE")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(request, timeout=timeout_s).close()
        deadline = time.monotonic() + timeout_s
        while (left := running()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def __exit__(self, *exc) -> None:
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self.log.close()


@dataclass
class StoredFacts:
    """What the committed (executed) notebook shows: the browser run must show the same."""

    code_cells: int
    # check lines ("✔ ... passed") in each code cell's outputs; None where nbval does not compare the
    # outputs (NBVAL_IGNORE_OUTPUT): there a check may run only on some machines, e.g. chapter 02's
    # "2 processes keep 2 cores busy" only where two cores are free
    passed_per_cell: tuple[int | None, ...]
    images: int
    widgets: int
    reports_progress: bool  # its launches call report_progress: per-rank progress bars must appear

    @property
    def passed_checks(self) -> int:
        return sum(n for n in self.passed_per_cell if n is not None)

    @classmethod
    def of(cls, notebook_path: Path) -> "StoredFacts":
        cells = json.loads(notebook_path.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        passed, images, widgets = [], 0, 0
        for cell in code:
            texts = []
            for output in cell.get("outputs", []):
                data = output.get("data", {})
                texts.append("".join(output.get("text", "")) + "".join(data.get("text/plain", "")))
                images += "image/png" in data or "image/svg+xml" in data
                widgets += WIDGET_MIME in data
            compared = _outputs_compared(cell)
            passed.append(sum(t.count(CHECK_PASSED) for t in texts) if compared else None)
        reports = any("report_progress(" in "".join(c["source"]) for c in code)
        return cls(len(code), tuple(passed), images, widgets, reports)


@dataclass
class BrowserRun:
    """What the browser showed for one notebook, and every problem found in it."""

    notebook: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    live_view_seen: bool = False
    progress_bars_seen: int = 0  # the most progress bars shown at one moment
    widgets_responded: int = 0


_READ_PAGE = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const cells = [...panel.querySelectorAll('.jp-Cell.jp-CodeCell')];
  return cells.map(cell => ({
    prompt: (cell.querySelector('.jp-InputPrompt') || {}).textContent || '',
    text: [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent).join('\\n'),
    stderr: cell.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]').length,
    stderrText: [...cell.querySelectorAll('[data-mime-type="application/vnd.jupyter.stderr"]')].map(o => o.textContent).join('\\n'),
    errors: cell.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"] pre, .jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]').length,
    // figures a live widget draws (an explorer's current view) are not stored as images
    images: [...cell.querySelectorAll('.jp-OutputArea-output img')].filter(i => !i.closest('.jupyter-widgets'))
              .map(i => i.complete && i.naturalWidth > 0),
    widgets: cell.querySelectorAll('.jp-OutputArea-output .jupyter-widgets, .jp-OutputArea-output .widget-container, .jp-OutputArea-output .lm-Widget.jupyter-widgets').length,
    progress: cell.querySelectorAll('.jp-OutputArea-output :is(progress, .widget-hprogress, .widget-vprogress)').length,
    fallback: [...cell.querySelectorAll('.jp-OutputArea-output')].some(o => /^(IntSlider|FloatSlider|VBox|HBox|interactive|Dropdown)\\(/.test(o.textContent.trim())),
  }));
}"""


# Progress bars live for seconds: a MutationObserver notes the most seen at once, however short.
_WATCH_PROGRESS = """() => {
  window.__progressBarsSeen = 0;
  new MutationObserver(() => {
    const shown = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output :is(progress, .widget-hprogress, .widget-vprogress)').length;
    window.__progressBarsSeen = Math.max(window.__progressBarsSeen, shown);
  }).observe(document.body, {childList: true, subtree: true});
}"""


def _wait_until_every_cell_is_rendered(page, run: BrowserRun, code_cells: int, timeout_s: float = 180) -> None:
    """JupyterLab 4 (windowing mode "contentVisibility", its default) puts a notebook's cells into
    the page a few at a time, in the browser's idle time, and a busy browser has little. A cell
    that runs before it is there updates its outputs off the page: a launch's live view and
    progress bars come and go unseen (a cause of "0 progress bars showed", reproduced with the
    browser's CPU throttled 6x). So Run All waits until every code cell is in the page."""
    try:
        page.wait_for_function("n => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                               ".jp-Cell.jp-CodeCell').length >= n", arg=code_cells, timeout=timeout_s * 1000)
    except Exception:  # noqa: BLE001 - reported as a problem of the page, the run goes on
        shown = page.evaluate("() => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) "
                              ".jp-Cell.jp-CodeCell').length")
        run.problems.append(f"only {shown} of {code_cells} code cells were in the page {timeout_s:.0f} s after "
                            "the kernel was ready")


def _run_all(page) -> None:
    """Run > Run All Cells, from JupyterLab's own menu (as a learner clicks it)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click(timeout=30_000)
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click(timeout=30_000)


def _cell_run_all_stopped_at(cells: list[dict], done: list[bool]) -> int | None:
    """JupyterLab's Run All stops at a cell that raises and takes the queued cells' [*] away: the
    cells after it never run, which is not a hang of the next one (and waiting for it would be).
    The index of the cell that raised, or None while Run All goes on."""
    if False not in done or done.index(False) == 0:
        return None
    failed = done.index(False) - 1
    if cells[failed]["errors"] > 0 and not any(c["prompt"].strip() == "[*]:" for c in cells):
        return failed
    return None


def _kernel_idle(page) -> bool:
    status = page.locator(".jp-Notebook-ExecutionIndicator, .jp-KernelStatus").first
    with contextlib.suppress(Exception):
        title = (status.get_attribute("title") or "") + (status.get_attribute("data-status") or "")
        if "busy" in title.lower():
            return False
    return True


def open_notebook(page, lab, name: str) -> None:
    """Open ``name`` (a path under the lab's root) as the only tab, and wait until its kernel is idle:
    cells run while it still says "Connecting" can be lost (a slow kernel start, e.g. on a loaded machine)."""
    page.goto(lab.url(f"lab/tree/{name}") + "&reset")  # only this notebook open
    page.wait_for_selector(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell", timeout=120_000)
    page.wait_for_function("() => document.querySelector('.jp-Notebook-ExecutionIndicator') !== null"
                           " || document.querySelector('.jp-KernelStatus') !== null", timeout=60_000)
    page.wait_for_function("() => /\\|\\s*Idle/.test((document.querySelector('#jp-main-statusbar') || {}).textContent"
                           " || '')", timeout=120_000)
    time.sleep(1)


def _code_cell(page, index: int):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell.jp-CodeCell").nth(index)


def paste_into_cell(page, index: int, code: str) -> None:
    """Replace code cell ``index``'s text with ``code`` as a learner pasting it does: select all in the
    cell's editor, then a paste (typing would meet the editor's automatic brackets and indentation)."""
    editor = _code_cell(page, index).locator(".cm-content")
    editor.scroll_into_view_if_needed(timeout=30_000)
    editor.click(timeout=30_000)
    page.keyboard.press("Control+A")
    editor.evaluate("""(node, text) => {
      const data = new DataTransfer();
      data.setData('text/plain', text);
      node.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, cancelable: true}));
    }""", code)
    shown = editor.inner_text(timeout=10_000)
    if shown.split() != code.split():
        raise AssertionError(f"code cell {index} shows {shown!r} after the paste, not the code pasted")


def run_cell(page, index: int, timeout_s: float = 300) -> str:
    """Run code cell ``index`` (Shift+Enter in its editor) and return the text of its outputs once
    its prompt shows a number again and the kernel is idle."""
    cell = _code_cell(page, index)
    before = (cell.locator(".jp-InputPrompt").inner_text(timeout=10_000) or "").strip()
    cell.locator(".cm-content").click(timeout=30_000)
    page.keyboard.press("Shift+Enter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        prompt = (cell.locator(".jp-InputPrompt").inner_text(timeout=10_000) or "").strip()
        if re.fullmatch(r"\[\d+\]:", prompt) and prompt != before and _kernel_idle(page):
            time.sleep(0.5)  # the last outputs can reach the page just after the prompt
            return "\n".join(cell.locator(".jp-OutputArea-output").all_inner_texts())
    raise AssertionError(f"code cell {index} did not finish within {timeout_s:.0f} s")


def run_notebook(page, lab: JupyterLab, name: str, stored: StoredFacts, shots: Path | None,
                 timeout_s: float = 600, explorer_wait_s: float = 90, compare_with: Path | None = None,
                 sanitize_file: Path | None = None, cell_timeout_s: float = 300) -> BrowserRun:
    """Open ``name`` in JupyterLab, Run All, wait for the kernel, and report what the page shows.

    A hang is a cell that does not finish within ``cell_timeout_s`` (nbval's cell timeout in
    `make test`); ``timeout_s`` bounds the whole run, far above any machine's time for it. How
    long a whole lesson takes is the machine's share, not the lesson's: lesson 01 with spawned
    workers took 153 s alone on 2 cores, 714 s beside the sandboxed class grading and 952 s
    beside that and two busy loops, with every cell well inside the cell timeout.

    With ``compare_with`` (the committed notebook), the run is saved from JupyterLab and every
    cell's outputs are compared with the stored ones as nbval compares them (``sanitize_file``:
    nbval's sanitizer config), so this one run also does nbval's job for the notebook.
    """
    run = BrowserRun(name)
    started = time.monotonic()
    open_notebook(page, lab, name)
    _wait_until_every_cell_is_rendered(page, run, stored.code_cells)
    if shots:
        page.screenshot(path=str(shots / f"{Path(name).stem}-top.png"))
    page.evaluate(_WATCH_PROGRESS)
    _run_all(page)
    deadline = time.monotonic() + timeout_s
    cells, last, progressed, stopped_polls = [], None, time.monotonic(), 0
    while time.monotonic() < deadline:
        time.sleep(1)
        cells = page.evaluate(_READ_PAGE)
        if any(LIVE_VIEW.search(c["text"]) for c in cells):
            run.live_view_seen = True
        done = [bool(re.fullmatch(r"\[\d+\]:", c["prompt"].strip())) for c in cells]
        if done and all(done) and _kernel_idle(page):
            break
        failed = _cell_run_all_stopped_at(cells, done)
        stopped_polls = stopped_polls + 1 if failed is not None and _kernel_idle(page) else 0
        if stopped_polls >= 3:  # the same for 3 s: not a moment between two cells
            run.problems.append(f"code cell {failed} ended in an error, so Run All stopped there "
                                f"({len(done) - failed - 1} code cells after it did not run)")
            break
        if done != last:  # a cell finished (or Run All queued them all): the kernel is not stuck
            last, progressed = done, time.monotonic()
        elif time.monotonic() - progressed > cell_timeout_s:
            running = done.index(False) if False in done else len(done)
            run.problems.append(f"code cell {running} did not finish within {cell_timeout_s:.0f} s (a hang; "
                                f"{sum(done)} of {len(done)} code cells had finished)")
            break
    else:
        run.problems.append(f"the notebook did not finish within {timeout_s:.0f} s")
    # A cell's last outputs can reach the page a moment after its prompt and the kernel's idle
    # status: while the checks shown differ from the stored ones, read the page again (up to 15 s).
    settled = time.monotonic() + 15
    while (len(cells) != stored.code_cells or _check_counts_differ(cells, stored)) and time.monotonic() < settled:
        time.sleep(1)
        cells = page.evaluate(_READ_PAGE)
    run.seconds = time.monotonic() - started
    run.progress_bars_seen = page.evaluate("() => window.__progressBarsSeen")
    _inspect(run, cells, stored)
    if compare_with is not None:  # before the explorers are moved: outputs as Run All left them
        saved = lab.root / name
        if save_notebook(page, saved):
            run.problems += output_differences(saved, compare_with, sanitize_file)
        else:
            run.problems.append("the notebook could not be saved from JupyterLab, so its outputs were not compared")
    if stored.reports_progress and run.progress_bars_seen < 2:
        run.problems.append(f"its launches call report_progress, but {run.progress_bars_seen} progress bars "
                            "showed while they ran (one per rank expected)")
    run.widgets_responded = _exercise_explorers(page, run, explorer_wait_s)
    if stored.widgets and not run.widgets_responded:
        run.problems.append("no explorer answered when its slider was moved")
    if shots:
        # The last cell, not the panel's full height: below the last cell JupyterLab leaves a
        # view's height of empty space (its "scroll past end"), and the screenshot showed only that.
        with contextlib.suppress(Exception):
            page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").last.scroll_into_view_if_needed(timeout=10_000)
        time.sleep(1)
        page.screenshot(path=str(shots / f"{Path(name).stem}-end.png"))
    return run


def save_notebook(page, path: Path, timeout_s: float = 60) -> bool:
    """File > Save Notebook, from JupyterLab's menu; True once the file on disk has changed."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click(timeout=30_000)
    page.locator(".lm-Menu-item[data-command='docmanager:save']").first.click(timeout=30_000)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_mtime_ns != before:
            time.sleep(1)  # let the write finish
            return True
        time.sleep(0.5)
    return False


class _StoredOutputComparison:
    """nbval's own comparison of one cell's outputs (its sanitizer, stream coalescing, skipped keys)."""

    from nbval.plugin import IPyNbCell as _Cell

    compare_outputs = _Cell.compare_outputs
    sanitize = _Cell.sanitize
    # nbval's defaults without --nbdime: images, widget ids and counters are not compared.
    SKIP = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
            "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")

    def __init__(self, sanitize_file: Path):
        from types import SimpleNamespace

        from nbval.plugin import get_sanitize_patterns, nocolors

        patterns = dict(get_sanitize_patterns(sanitize_file.read_text()))
        self.parent = SimpleNamespace(skip_compare=self.SKIP, sanitize_patterns=patterns)
        self.colors = nocolors
        self.comparison_traceback: list[str] = []

    def format_output_compare(self, key, stored, now):
        import difflib

        diff = difflib.unified_diff(str(stored).splitlines(), str(now).splitlines(), "stored", "in the browser",
                                    lineterm="", n=1)
        self.comparison_traceback.append(f"{key}:\n" + "\n".join(list(diff)[:40]))


def output_differences(saved: Path, stored: Path, sanitize_file: Path) -> list[str]:
    """Cells whose outputs in ``saved`` (the browser's run) differ from ``stored``, as nbval judges.

    Cells marked NBVAL_IGNORE_OUTPUT or NBVAL_SKIP, and cells stored unrun, are not compared.
    """
    import nbformat
    from nbval.plugin import coalesce_streams

    comparison = _StoredOutputComparison(sanitize_file)
    now = [c for c in nbformat.read(saved, as_version=4).cells if c.cell_type == "code"]
    then = [c for c in nbformat.read(stored, as_version=4).cells if c.cell_type == "code"]
    if len(now) != len(then):
        return [f"the saved notebook has {len(now)} code cells, the stored one {len(then)}"]
    problems = []
    for number, (ran, kept) in enumerate(zip(now, then)):
        if not _outputs_compared(kept) or kept.execution_count is None:
            continue
        comparison.comparison_traceback = []
        if not comparison.compare_outputs(coalesce_streams(ran.outputs), coalesce_streams(kept.outputs)):
            detail = "\n".join(comparison.comparison_traceback)[:2000]
            problems.append(f"code cell {number}: its outputs differ from the stored ones\n{detail}")
    return problems


def _outputs_compared(cell: dict) -> bool:
    """Whether nbval compares this stored code cell's outputs (no NBVAL_SKIP or NBVAL_IGNORE_OUTPUT)."""
    from nbval.plugin import find_comment_markers, find_metadata_tags

    options = dict(find_metadata_tags(cell.get("metadata", {})))
    options.update(dict(find_comment_markers("".join(cell["source"]))))
    return not options.get("skip") and options.get("check", True)


def _passed_per_cell(cells: list[dict]) -> list[int]:
    return [c["text"].count(CHECK_PASSED) for c in cells]


def _check_counts_differ(cells: list[dict], stored: "StoredFacts") -> list[int]:
    """The code cells whose passed checks on the page differ from the stored ones (compared cells only)."""
    return [i for i, (n, m) in enumerate(zip(_passed_per_cell(cells), stored.passed_per_cell))
            if m is not None and n != m]


def _head_and_tail(text: str, head: int = 300, tail: int = 900) -> str:
    """A long error's start (where it was raised) and end (what it says: a traceback's last line is the
    exception's message), never only the start."""
    return text if len(text) <= head + tail else f"{text[:head]} [...] {text[-tail:]}"


def _inspect(run: BrowserRun, cells: list[dict], stored: StoredFacts) -> None:
    numbers = [int(re.sub(r"\D", "", c["prompt"]) or 0) for c in cells]
    if len(cells) != stored.code_cells:
        run.problems.append(f"{len(cells)} code cells on the page, {stored.code_cells} in the notebook")
    if numbers != sorted(numbers) or len(set(numbers)) != len(numbers) or 0 in numbers:
        run.problems.append(f"cells did not all run once, in order: prompts {numbers}")
    text = "\n".join(c["text"] for c in cells)
    if CHECK_FAILED in text:
        failed = [line for line in text.splitlines() if CHECK_FAILED in line]
        run.problems.append(f"a check failed: {failed[0][:200]}")
    differing = _check_counts_differ(cells, stored)
    if differing:
        page_counts = _passed_per_cell(cells)
        where = [f"code cell {i}: {page_counts[i]} on the page, {stored.passed_per_cell[i]} stored, "
                 f"page shows {cells[i]['text'][-300:]!r}" for i in differing]
        run.problems.append(f"passed checks on the page differ from the stored notebook's in {len(differing)} "
                            "compared code cells" + "".join(f"\n  {line}" for line in where))
    stderr_cells = [i for i, c in enumerate(cells) if c["stderr"]]
    if stderr_cells:
        # What was written, not only where: stderr that shows once in many runs (a process of an earlier cell
        # ending late, say) has to be read from the report of the run that saw it.
        said = "".join(f"\n  code cell {i}: {_head_and_tail(cells[i]['stderrText'].strip())!r}" for i in stderr_cells)
        run.problems.append(f"stderr or error output in code cells {stderr_cells}:{said}")
    images = [ok for c in cells for ok in c["images"]]
    if len(images) != stored.images or not all(images):
        run.problems.append(f"{sum(images)} figures rendered as images on the page, "
                            f"{stored.images} in the stored notebook")
    if any(LIVE_VIEW.search(c["text"]) for c in cells):
        run.problems.append("a launch's live view was still showing after the run")
    if any(c["progress"] for c in cells):
        run.problems.append("progress bars were still showing after the run")
    widgets = sum(c["widgets"] > 0 for c in cells)
    if any(c["fallback"] for c in cells):
        run.problems.append("a widget was shown as its text fallback, not as a widget")
    if stored.widgets and not widgets:
        run.problems.append(f"the stored notebook has {stored.widgets} widget outputs; none rendered")


def _explorer_view(explorer) -> str:
    """What an explorer has drawn: its output widgets' HTML (printed numbers, figure images)."""
    return explorer.locator(".widget-output").evaluate_all("views => views.map(v => v.innerHTML).join('')")


def _status_bar(page) -> str:
    with contextlib.suppress(Exception):
        return " ".join(page.locator("#jp-main-statusbar").inner_text(timeout=5_000).split())
    return "(unreadable)"


def _settled_view(page, explorer, quiet_s: float = 1.5, limit_s: float = 60) -> str:
    """The explorer's drawing once the kernel is idle and the drawing has stopped changing.

    A redraw reaches the page in parts (``clear_output(wait=True)``, the printed line, then the
    figure), so a drawing read mid-redraw is not the one the next move must change: reading it
    there let a late figure from the previous move pass for this move's answer."""
    deadline = time.monotonic() + limit_s
    view, since = _explorer_view(explorer), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = _explorer_view(explorer)
        if now != view:
            view, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s and _kernel_idle(page):
            break
    return view


def _move_one_step(page, slider, handle) -> tuple[str, str]:
    """Press one arrow key on the slider's focused handle; the readout before and after.

    The readout is drawn by the page alone, so it tells a key press that never reached the
    slider apart from a kernel that did not answer."""
    readout = slider.locator(".widget-readout").first
    before = readout.inner_text(timeout=5_000)
    at_max = handle.get_attribute("aria-valuenow") == handle.get_attribute("aria-valuemax")
    handle.focus()
    if not handle.evaluate("h => h === document.activeElement"):
        raise RuntimeError("its handle did not take the keyboard focus")
    page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
    deadline = time.monotonic() + 10
    while readout.inner_text(timeout=5_000) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    return before, readout.inner_text(timeout=5_000)


def _exercise_explorers(page, run: BrowserRun, wait_s: float = 90) -> int:
    """Move every slider one step with the keyboard, press its explorer's Run button if it has one
    (``interact_manual``), and wait for the explorer's drawing to change: proof that the kernel got
    the new value and answered (a slider's own readout changes without any kernel). Each move
    starts from a settled drawing and is judged on the settled drawing after it, one at a time."""
    sliders = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .widget-slider")
    responded = 0
    for index in range(sliders.count()):
        slider = sliders.nth(index)
        handle = slider.locator("[role=slider], .noUi-handle").first
        explorer = slider.locator("xpath=ancestor::div[contains(@class,'jp-OutputArea-output')][1]")
        try:
            slider.scroll_into_view_if_needed(timeout=5_000)
            before = _settled_view(page, explorer)
            shown_before, shown_after = _move_one_step(page, slider, handle)
            if shown_after == shown_before:
                run.problems.append(f"slider {index} did not move: its readout stayed {shown_before!r} 10 s after "
                                    "an arrow key was pressed on its focused handle")
                continue
            button = explorer.locator(".widget-button")
            if button.count():
                button.first.click(timeout=5_000)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and _explorer_view(explorer) == before:
                time.sleep(0.5)
            after = _settled_view(page, explorer)
        except Exception as exc:  # noqa: BLE001 - reported as a problem of the page
            run.problems.append(f"slider {index} could not be moved: {type(exc).__name__}: {exc}")
            continue
        if after != before:
            responded += 1
        else:
            run.problems.append(f"slider {index} moved ({shown_before!r} to {shown_after!r}) but its explorer did not "
                                f"redraw within {wait_s:.0f} s; status bar: {_status_bar(page)}")
    return responded


@contextlib.contextmanager
def browser_page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), headless=True,
                                             args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            yield page
        finally:
            browser.close()
