"""How an instructor reads a learner's notebook (docs/instructors.md): no script of the learner's runs.

The command the guide shows, run as written on a collected copy, turns a hostile notebook into HTML;
Chromium opens it (from a file, as the instructor would) and nothing the learner wrote runs: not a
JavaScript output (which a notebook the learner marked trusted would run in JupyterLab), not a script or
an event handler in an HTML output or in Markdown, not one inside an SVG. The same command without
``--sanitize-html`` runs them, so the check can fail.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import nbformat
import pytest

from browser import browser_page, missing_requirements
from optional import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
MISSING = missing_requirements()
RAN = "window.__learners_script_ran = (window.__learners_script_ran || []).concat"


def guide_command() -> str:
    lines = [line.strip() for line in (REPO / "docs" / "instructors.md").read_text().splitlines()]
    found = [line for line in lines if line.startswith(".venv/bin/jupyter nbconvert")]
    assert len(found) == 1, found
    return found[0]


def hostile_notebook(path: Path) -> None:
    markdown = nbformat.v4.new_markdown_cell(f'Read me <img src="x" onerror="{RAN}([\'markdown img\'])">'
                                             f"<script>{RAN}(['markdown script'])</script>")
    code = nbformat.v4.new_code_cell("print('my answer')")
    code.outputs = [
        nbformat.v4.new_output("display_data", {"application/javascript": f"{RAN}(['javascript output'])"}),
        nbformat.v4.new_output("display_data", {"text/html": f"<b>result</b><script>{RAN}(['html script'])</script>"
                                                             f'<img src="y" onerror="{RAN}([\'html img\'])">'}),
        nbformat.v4.new_output("display_data", {"image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg">'
                                                                 f"<script>{RAN}(['svg script'])</script></svg>"}),
    ]
    notebook = nbformat.v4.new_notebook(cells=[markdown, code])
    nbformat.write(notebook, path)
    subprocess.run([str(REPO / ".venv" / "bin" / "jupyter"), "trust", str(path)], check=True, capture_output=True)


def scripts_that_ran(html: Path) -> list[str]:
    with browser_page() as page:
        page.goto(html.as_uri())
        page.wait_for_timeout(1500)  # images fail to load, and their handlers would run, meanwhile
        return page.evaluate("window.__learners_script_ran || []")


@pytest.mark.parametrize("sanitized", [True, False], ids=["as the guide says", "without --sanitize-html"])
def test_a_learners_notebook_read_as_the_guide_says_runs_none_of_its_scripts(tmp_path, sanitized):
    skip_or_fail(MISSING, "COURSE_REQUIRE_BROWSER", "the browser test of reading a learner's work")
    learner = tmp_path / "SUBMISSIONS" / "ada"
    learner.mkdir(parents=True)
    hostile_notebook(learner / "01_collectives.ipynb")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    command = shlex.split(guide_command())
    if not sanitized:
        command.remove("--sanitize-html")
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=120,
                   env=dict(os.environ, JUPYTER_PLATFORM_DIRS="1"))
    html = tmp_path / "READ" / "01_collectives.html"
    assert "my answer" in html.read_text()
    ran = scripts_that_ran(html)
    if sanitized:
        assert ran == [], ran
    else:  # the same page, unsanitized: the check above could fail
        assert "html script" in ran and "javascript output" in ran, ran
