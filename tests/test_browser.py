"""Every lesson, run in JupyterLab in headless Chromium, as a learner runs it.

nbval runs kernels without a browser; this test opens each lesson notebook in a real
JupyterLab, clicks Run > Run All Cells, waits for the kernel, and checks from the page:
every code cell ran once, in order; as many passed checks as the stored notebook and no
failed one; no error or stderr output; every figure decoded as an image; the launch's live
view gone at the end; per-rank progress bars shown while training launches that report progress
run, and gone at the end; widgets drawn as widgets; every explorer's slider moved by keyboard
(and its Run button pressed) makes the kernel redraw the explorer.
Screenshots of each notebook's top and end go to $COURSE_SCREENSHOTS (default
tests/browser-screenshots/, not committed).

Needs Playwright and a Chromium (`make browser-deps`); without them the test is skipped with
the reason, unless COURSE_REQUIRE_BROWSER=1 (CI), where it fails instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nbformat
import pytest

from browser import JupyterLab, StoredFacts, browser_page, missing_requirements, run_notebook
from optional import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
NEWS_PROMPT = "official Jupyter news"


def _skip_or_fail_without_a_browser():
    skip_or_fail(missing_requirements(), "COURSE_REQUIRE_BROWSER", "the browser test")


@pytest.fixture(scope="module")
def page():
    _skip_or_fail_without_a_browser()
    with browser_page() as page:  # one browser for the module (Playwright's sync API does not nest)
        yield page


# Lessons the browser runs in another kernel than nbval's (`make test` passes the lists): with
# every worker started by spawn, as on macOS and Windows; on PyTorch's and MKL's plain CPU
# kernels, which round differently from the AVX2/AVX-512 ones as a grader's CPU might. The
# stored outputs must be the same; nbval runs these lessons in the default kernel.
KERNEL_VARIANTS = {
    "spawn": ("COURSE_BROWSER_SPAWN", {"COURSE_START_METHOD": "spawn"}),
    "plain-cpu-kernels": ("COURSE_BROWSER_PLAIN_KERNELS", {"ATEN_CPU_CAPABILITY": "default",
                                                           "MKL_CBWR": "COMPATIBLE"}),
}


def kernel_variant(name: str) -> str | None:
    for variant, (variable, _) in KERNEL_VARIANTS.items():
        if name in os.environ.get(variable, "").split():
            return variant
    return None


@pytest.fixture(scope="module")
def lab(tmp_path_factory, page):
    root = tmp_path_factory.mktemp("lab")
    shutil.copytree(REPO / "notebooks", root / "notebooks")  # the browser's saves never touch the repo
    variants = {variant: env for variant, (_, env) in KERNEL_VARIANTS.items()}
    with JupyterLab(root / "notebooks", kernel_variants=variants) as server:
        yield server, page


@pytest.fixture(scope="module")
def screenshots():
    folder = Path(os.environ.get("COURSE_SCREENSHOTS", REPO / "tests" / "browser-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.timeout(2100)  # above run_notebook's own 1800 s, so a slow lesson is reported with what the page shows
@pytest.mark.parametrize("name", LESSONS)
def test_lesson_runs_in_jupyterlab_as_stored(lab, screenshots, name):
    server, page = lab
    variant = kernel_variant(name)
    if variant:
        server.use_kernel(name, variant)
    stored = StoredFacts.of(REPO / "notebooks" / name)
    # The run is saved and compared, cell by cell, with the committed outputs as nbval would:
    # `make test` runs each lesson once, here, instead of once here and once more under nbval.
    # A hang is a cell that runs past nbval's cell timeout (run_notebook's cell_timeout_s); the 1800 s
    # for the whole lesson is only a bound, about twice the slowest run seen (lesson 01 with spawned
    # workers: 952 s beside the class grading and two busy loops on 2 cores, 153 s alone).
    try:
        run = run_notebook(page, server, name, stored, screenshots, compare_with=REPO / "notebooks" / name,
                           sanitize_file=REPO / "tests" / "nbval_sanitize.cfg", timeout_s=1800)
    finally:
        left = server.shut_down_kernels()  # the next lesson runs without this one's kernel beside it
    assert not left, f"kernels {left} still running 60 s after they were told to shut down"
    kernel = f", kernel {variant}" if variant else ""
    assert not run.problems, f"{name} in the browser ({run.seconds:.0f} s{kernel}):\n" + "\n".join(run.problems)
    assert NEWS_PROMPT not in page.inner_text("body"), "JupyterLab's news pop-up covers the notebook"


def _broken_notebook(folder: Path) -> str:
    """A notebook whose stored outputs promise what its code no longer does."""
    stored_check = nbformat.v4.new_output("stream", name="stdout", text="\u2714 the sum: passed\n")
    stored_figure = nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=",
                                                                 "text/plain": "<Figure>"})
    cells = [
        nbformat.v4.new_code_cell("print('\\u2718 FAILED the sum: expected 6, got 5')",
                                  outputs=[stored_check]),
        nbformat.v4.new_code_cell("import warnings\nwarnings.warn('a deprecated call')"),
        nbformat.v4.new_code_cell("x = 1  # the figure this cell drew is gone", outputs=[stored_figure]),
        nbformat.v4.new_code_cell("import ipywidgets as widgets\n"
                                  "widgets.IntProgress(value=3, max=10)  # a progress bar left behind"),
        nbformat.v4.new_code_cell("widgets.interactive(lambda k: None, k=widgets.IntSlider(0, 0, 5))  # draws nothing"),
        nbformat.v4.new_code_cell("widgets.interactive(lambda k: print(k), k=widgets.IntSlider(0, 0, 5, disabled=True))  # cannot move"),
        nbformat.v4.new_code_cell("def train():\n    report_progress(1, 1)  # never launched: no bars"),
        # outputs nbval does not compare: a check stored here may be one this machine does not make
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint('2 processes not checked: 2 cores busy')",
                                  outputs=[stored_check]),
        # Run All stops at an error: the cell after it never runs, which must not be reported as a hang
        nbformat.v4.new_code_cell("raise ValueError('a bug the lesson does not expect')"),
        nbformat.v4.new_code_cell("print('never runs')"),
    ]
    for count, cell in enumerate(cells, start=1):
        cell.execution_count = count  # stored as run, so its outputs are compared
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, folder / "broken.ipynb")
    return "broken.ipynb"


def test_the_browser_check_catches_a_broken_notebook(tmp_path, page):
    name = _broken_notebook(tmp_path)
    stored = StoredFacts.of(tmp_path / name)
    committed = shutil.copy(tmp_path / name, tmp_path / "committed.ipynb")  # the lab saves over its own copy
    with JupyterLab(tmp_path) as server:
        run = run_notebook(page, server, name, stored, None, timeout_s=120, explorer_wait_s=10,
                           compare_with=Path(committed), sanitize_file=REPO / "tests" / "nbval_sanitize.cfg")
    found = "\n".join(run.problems)
    assert "code cell 8 ended in an error, so Run All stopped there (1 code cells after it did not run)" in found, found
    assert "did not finish" not in found, found
    assert "code cell 0: its outputs differ from the stored ones" in found, found
    assert "FAILED the sum" in found.split("code cell 0:")[1], found  # the diff shows what the run printed
    assert "a check failed: \u2718 FAILED the sum" in found, found
    assert "passed checks on the page differ from the stored notebook's in 1 compared code cells" in found, found
    assert "code cell 0: 0 on the page, 1 stored" in found, found
    assert "code cell 7" not in found, found  # its outputs, checks included, are not compared
    assert "stderr or error output in code cells [1, 8]:" in found, found
    said = found.split("stderr or error output in code cells [1, 8]:")[1]
    assert "\n  code cell 1: " in said and "a deprecated call" in said, found  # what it said, not only where
    assert "0 figures rendered as images on the page, 1 in the stored notebook" in found, found
    assert "progress bars were still showing after the run" in found, found
    assert "slider 0 moved ('0' to '1') but its explorer did not redraw" in found, found
    assert "slider 1 did not move: its readout stayed '0'" in found, found  # a lost key press is told apart
    assert "its launches call report_progress, but 1 progress bars showed" in found, found


def test_the_static_site_opens_and_links_to_every_chapter(tmp_path, page):
    import subprocess
    import sys

    site = tmp_path / "site"
    build = subprocess.run([sys.executable, str(REPO / "scripts" / "build_site.py"), "--out", str(site)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    page.goto((site / "index.html").as_uri())
    links = page.locator("#chapters a")
    assert links.count() == len(LESSONS)
    assert [links.nth(i).get_attribute("href") for i in range(links.count())] == [
        name.replace(".ipynb", ".html") for name in LESSONS]
    assert page.evaluate("() => [...document.images].filter(i => i.complete && i.naturalWidth > 0).length") >= 1
    for doc in page.locator('a[href^="docs/"], a[href="CONTRIBUTING.html"]').all():  # the docs, rendered beside it
        assert (site / doc.get_attribute("href")).exists(), doc.get_attribute("href")
    links.nth(1).click()  # the first chapter with figures and checks
    page.wait_for_load_state("load")
    assert page.url.endswith(LESSONS[1].replace(".ipynb", ".html"))
    stored = StoredFacts.of(REPO / "notebooks" / LESSONS[1])
    decoded = page.evaluate("() => [...document.images].filter(i => i.complete && i.naturalWidth > 0).length")
    assert decoded >= stored.images > 0
    assert page.inner_text("body").count("\u2714") >= stored.passed_checks


def test_a_kernel_variant_runs_the_notebook_with_its_environment(tmp_path, page):
    # The stored output says which environment the kernel must have: the comparison fails otherwise.
    printed = nbformat.v4.new_output("stream", name="stdout", text="spawn None\n")
    cell = nbformat.v4.new_code_cell("import os\nprint(os.environ.get('COURSE_START_METHOD'), "
                                     "os.environ.get('ATEN_CPU_CAPABILITY'))", outputs=[printed], execution_count=1)
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "variant.ipynb")
    committed = shutil.copy(tmp_path / "variant.ipynb", tmp_path / "committed.ipynb")
    variants = {variant: env for variant, (_, env) in KERNEL_VARIANTS.items()}
    with JupyterLab(tmp_path, kernel_variants=variants) as server:
        server.use_kernel("variant.ipynb", "spawn")
        run = run_notebook(page, server, "variant.ipynb", StoredFacts.of(Path(committed)), None, timeout_s=120,
                           compare_with=Path(committed), sanitize_file=REPO / "tests" / "nbval_sanitize.cfg")
    assert not run.problems, "\n".join(run.problems)


def test_a_slow_lesson_runs_on_and_a_stuck_cell_is_reported(tmp_path, page):
    # Three 4 s cells take longer than the 8 s cell timeout together, and are not a hang; the fourth is.
    cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(4)") for _ in range(3)]
    cells.append(nbformat.v4.new_code_cell("time.sleep(600)  # stuck"))
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "stuck.ipynb")
    with JupyterLab(tmp_path) as server:
        run = run_notebook(page, server, "stuck.ipynb", StoredFacts.of(tmp_path / "stuck.ipynb"), None,
                           timeout_s=120, cell_timeout_s=8, explorer_wait_s=1)
    assert run.problems[:1] == ["code cell 3 did not finish within 8 s (a hang; 3 of 4 code cells had finished)"], \
        run.problems
    assert run.seconds < 60, run.seconds  # told at the stuck cell, not at the whole run's 120 s
