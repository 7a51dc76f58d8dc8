"""The README (the learners' page) and docs/: short, linked, and their numbers computed, not typed."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#:]+)(#[^)]*)?\)")  # [text](relative/path), not http: links


def test_the_readme_is_a_page_for_learners():
    assert len((REPO / "README.md").read_text().splitlines()) <= 120


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file():
    for page in PAGES:
        for target, _ in LINK.findall(page.read_text()):
            assert (page.parent / target).exists(), f"{page.relative_to(REPO)} links to {target}, which is not there"


def exercise_checks_and_points(stem: str) -> str:
    solution = REPO / "solutions" / f"{stem}.ipynb"
    if not solution.exists():
        return "—"
    graded = [cell["metadata"]["nbgrader"] for cell in json.loads(solution.read_text())["cells"]
              if cell["metadata"].get("nbgrader", {}).get("grade")]
    return f"{len(graded)} checks, {sum(int(grade.get('points', 0)) for grade in graded)} points"


def test_the_chapter_table_counts_each_exercise_as_its_solution_grades_it():
    rows = re.findall(r"^\| (\d\d) \| `(\w+)` \| .* \| ([^|]+) \|$", (REPO / "README.md").read_text(), re.M)
    lessons = sorted(path.stem for path in (REPO / "notebooks").glob("*.ipynb"))
    assert [stem for _, stem, _ in rows] == lessons
    for _, stem, exercises in rows:
        assert exercises.strip() == exercise_checks_and_points(stem), stem
