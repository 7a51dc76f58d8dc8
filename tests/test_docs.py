"""The README (the learners' page) and docs/: short, linked, and their numbers computed, not typed."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

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
    points = sum(int(grade.get("points", 0)) for grade in graded)
    return f"{len(graded)} {'check' if len(graded) == 1 else 'checks'}, {points} points"


def test_the_chapter_table_counts_each_exercise_as_its_solution_grades_it():
    rows = re.findall(r"^\| (\d\d) \| `(\w+)` \| .* \| ([^|]+) \| \d+ \|$", (REPO / "README.md").read_text(), re.M)
    lessons = sorted(path.stem for path in (REPO / "notebooks").glob("*.ipynb"))
    assert [stem for _, stem, _ in rows] == lessons
    for _, stem, exercises in rows:
        assert exercises.strip() == exercise_checks_and_points(stem), stem


def test_the_readme_picture_and_its_code_are_the_lessons_own():
    import sys

    sys.path.insert(0, str(REPO / "scripts"))
    from readme_picture import DEFINES, LESSON, PICTURE, stored_figure

    assert PICTURE.read_bytes() == stored_figure(), "run scripts/readme_picture.py: the lesson's figure changed"
    readme = (REPO / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    printed = readme.split("```text\n", 1)[1].split("```", 1)[0]
    cell = next(cell for cell in json.loads(LESSON.read_text())["cells"] if DEFINES in "".join(cell["source"]))
    for line in code.strip().splitlines():
        assert line in "".join(cell["source"]).splitlines(), line
    stored = "".join("".join(output.get("text", "")) for output in cell["outputs"])
    assert printed.strip() in stored.splitlines()


def test_the_memory_the_readme_asks_for_is_the_measured_peak():
    # scripts/notebook_memory.py exits 1 when the README's memory sentence differs from what
    # docs/notebook_memory.json (its --measure run over every lesson and solution) gives.
    import subprocess
    import sys
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "notebook_memory.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    measured = json.loads((REPO / "docs" / "notebook_memory.json").read_text())
    lessons = {path.relative_to(REPO).as_posix() for folder in ("notebooks", "solutions")
               for path in (REPO / folder).glob("*.ipynb")}
    assert lessons <= set(measured), f"not measured: {sorted(lessons - set(measured))}"


def test_the_chapter_minutes_and_the_agenda_are_computed_from_measured_run_times():
    # scripts/chapter_minutes.py exits 1 when the README's minutes or docs/instructors.md's agenda
    # differ from what docs/run_times.json (written by scripts/execute_notebooks.py) gives.
    import subprocess
    import sys
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "chapter_minutes.py")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_slurm_chapter_is_not_stored_while_no_cluster_answers(monkeypatch, capsys):
    # Its Slurm cells would store "skipped", and nbval would then fail wherever a cluster answers.
    import sys
    sys.path.insert(0, str(REPO / "scripts"))
    import execute_notebooks

    assert execute_notebooks.needs_slurm(REPO / "notebooks" / "04_launching_multinode.ipynb")
    assert not execute_notebooks.needs_slurm(REPO / "notebooks" / "01_collectives.ipynb")
    monkeypatch.setattr(execute_notebooks, "cluster_up", lambda: False)
    monkeypatch.setattr(execute_notebooks, "execute", lambda path: pytest.fail(f"{path} was executed"))
    assert execute_notebooks.main(["notebooks/04_launching_multinode.ipynb"]) == 1
    assert "make slurm-up" in capsys.readouterr().err


def test_the_class_folder_the_grading_docs_name_is_never_committed():
    """docs/grading.md has the instructor put the class's notebooks in SUBMISSIONS/ inside the course's
    folder: git must ignore it, or `git add -A` puts learners' work into the course's history."""
    ignored = subprocess.run(["git", "check-ignore", "-q", "SUBMISSIONS/ada/01_collectives.ipynb"], cwd=REPO)
    assert ignored.returncode == 0, "add /SUBMISSIONS/ to .gitignore"
