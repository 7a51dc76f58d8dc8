"""Render the executed lessons (the README, the learners' page, as the index; the docs beside it) to a static HTML site.

    .venv/bin/python scripts/build_site.py [--out site]        (or: make site)

An instructor can host the folder anywhere (it is plain files): each lesson as it was
executed, with its figures and check lines, links between chapters rewritten to the HTML
pages. Uses nbconvert's HTML exporter, which works offline.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune

REPO = Path(__file__).resolve().parent.parent
# notebooks/03_ddp.ipynb, ../notebooks/03_ddp.ipynb#anchor, 03_ddp.ipynb -> 03_ddp.html
NOTEBOOK_LINK = re.compile(r'href="(?:\.\./)?(?:notebooks/)?([\w.-]+)\.ipynb(#[^"]*)?"')
# docs/grading.md, CONTRIBUTING.md -> docs/grading.html, CONTRIBUTING.html (rendered beside the index)
MARKDOWN_LINK = re.compile(r'href="((?:docs/)?[\w.-]+)\.md(#[^"]*)?"')
DOCS = ["CONTRIBUTING.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
STYLE = """<style>body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.5}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2rem .5rem}
pre{background:#f6f6f6;padding:.5rem;overflow-x:auto}</style>"""


def html_links(text: str) -> str:
    text = NOTEBOOK_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', text)
    return MARKDOWN_LINK.sub(lambda m: f'href="{m.group(1)}.html{m.group(2) or ""}"', text)


def build_doc(relative: str, out: Path) -> Path:
    """One Markdown page of the course's docs, as HTML at the same place relative to the index."""
    body = html_links(markdown2html_mistune((REPO / relative).read_text(encoding="utf-8")))
    target = out / relative.replace(".md", ".html")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(relative)}'
                      f"</title>{STYLE}</head>\n<body>\n{body}\n</body></html>\n", encoding="utf-8")
    return target


def title_of(notebook_path: Path) -> str:
    for cell in json.loads(notebook_path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return notebook_path.stem


def build_lesson(path: Path, out: Path) -> Path:
    exporter = HTMLExporter(template_name="lab")
    body, _ = exporter.from_notebook_node(nbformat.read(path, as_version=4))
    target = out / f"{path.stem}.html"
    target.write_text(html_links(body), encoding="utf-8")
    return target


def build_index(lessons: list[Path], out: Path) -> Path:
    chapters = "\n".join(f'<li><a href="{p.stem}.html">{html.escape(title_of(p))}</a></li>' for p in lessons)
    readme = html_links(markdown2html_mistune((REPO / "README.md").read_text(encoding="utf-8")))
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Distributed training in PyTorch, hands-on</title>
{STYLE}</head>
<body>
<nav><h2>Chapters (executed)</h2><ol start="0" id="chapters">
{chapters}
</ol></nav>
<hr>
{readme}
</body></html>
"""
    target = out / "index.html"
    target.write_text(page, encoding="utf-8")
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "site"), help="output folder (default: site/)")
    options = parser.parse_args(argv)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    lessons = sorted((REPO / "notebooks").glob("*.ipynb"))
    for lesson in lessons:
        print(f"{lesson.relative_to(REPO)} -> {build_lesson(lesson, out).relative_to(out.parent)}")
    print(f"README.md -> {build_index(lessons, out).relative_to(out.parent)}")
    for relative in DOCS:
        print(f"{relative} -> {build_doc(relative, out).relative_to(out.parent)}")
    shutil.copytree(REPO / "docs" / "img", out / "docs" / "img", dirs_exist_ok=True)  # the pictures they show
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
