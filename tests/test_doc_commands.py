"""Every command README.md, CONTRIBUTING.md and docs/ show is a promise: something runs it as written.

A command is a line of a ```bash block, or a code span in the prose that starts as a command does
(``make ...``, ``.venv/bin/...``, ``python -m ...``, ``sudo ...``, ``torchrun ...``, ``VAR=value make ...``).
PROOFS says, for each, what runs it:
- ``Here()``: a test in this file runs it, in a scratch copy of the course where it writes; a
  benchmark runs at the smallest size, after its own parser has accepted the docs' arguments;
- ``By(path, evidence)``: another test file, or CI's script, runs it; ``evidence`` is the code there
  that runs it, so a test that stops running it fails here too;
- ``Wraps(target, runs)``: a make target whose recipe (``make -n``, read here) runs ``runs``, a
  command proven in one of the two ways above.
MENTIONS lists code spans that look like commands but are not offered to be run (a program's name
in a sentence). A command in the docs that is in neither fails the first test: prove it, or take it out.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
PYTHON = REPO / ".venv" / "bin" / "python"
# A make inside make (this file under `make test`) would print "Entering directory" lines, and take its flags.
MAKE_ENV = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
COMMAND_START = re.compile(r"^(make |\.venv/bin/\S+|python3? |sudo |torchrun |curl |([A-Z_]+=\S+ )+(make|\.venv)\b)")


@dataclass(frozen=True)
class Here:
    test: str  # the test of this file that runs it


@dataclass(frozen=True)
class By:
    path: str
    evidence: str


@dataclass(frozen=True)
class Wraps:
    target: str
    runs: str


PROOFS = {
    # learners
    "make lab": Wraps("lab", "jupyter lab"),  # make lab-server: the same lab, headless, run by tests/test_lab.py
    "make lab-server": By("tests/test_lab.py", '["make", "-s", "lab-server"'),
    "make lab PYTHON=python3.12": By("tests/test_setup.py", '["make", "-s", "setup", f"PYTHON='),
    "make lab TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu": Here("test_the_cpu_wheels_choice_reaches_pip"),
    "make setup": By("tests/test_setup.py", '["make", "-s", "setup"'),
    "make test": By(".ci/run", "exec make test"),
    "python -m course_lib.hand_in": By("tests/test_hub.py", 'startswith("python -m course_lib.hand_in")'),
    # instructors
    "sudo make hub HUB_ROSTER=roster.txt HUB_ADMIN=me HUB_DOMAIN=hub.example.org HUB_SSL_CERT=/etc/ssl/hub.pem "
    "HUB_SSL_KEY=/etc/ssl/hub.key": Wraps("hub", "jupyterhub -f jupyter/jupyterhub_config.py"),
    "make hub": Wraps("hub", "jupyterhub -f jupyter/jupyterhub_config.py"),
    "make hub-deps": By(".ci/run", "timeout 600 make hub-deps"),
    'printf "ada\\ngrace\\nlinus\\n" > roster.txt': Here("test_the_roster_line_writes_three_names"),
    "TOKEN=$(sudo cat .hub/api_token); HUB=https://hub.example.org:8000/hub/api":
        By("tests/test_hub.py", "_the_guides_api_calls("),
    'curl -H "Authorization: token $TOKEN" -X POST $HUB/users/ada/server': By("tests/test_hub.py", "_the_guides_api_calls("),
    'curl -H "Authorization: token $TOKEN" -X DELETE $HUB/users/ada/server': By("tests/test_hub.py", "_the_guides_api_calls("),
    "mkdir SUBMISSIONS": By("tests/test_hub.py", 'startswith(("mkdir SUBMISSIONS", "for home in"))'),
    'for home in "${HUB_HOMES:-/home}/${HUB_USER_PREFIX:-jupyter-}"*; do if [ -e "$home/handed-in" ]; then cp -r '
    '"$home/handed-in" "SUBMISSIONS/${home##*/"${HUB_USER_PREFIX:-jupyter-}"}"; fi; done':
        By("tests/test_hub.py", 'startswith(("mkdir SUBMISSIONS", "for home in"))'),
    ".venv/bin/python scripts/grade.py SUBMISSIONS": Here("test_grading_a_class_as_the_guide_says"),
    ".venv/bin/python scripts/grade.py SUBMISSIONS --slurm": By(
        "tests/test_grading_slurm.py", 'run_as_written(".venv/bin/python scripts/grade.py SUBMISSIONS --slurm"'),
    ".venv/bin/jupyter nbconvert --to html --sanitize-html --output-dir READ SUBMISSIONS/ada/01_collectives.ipynb":
        By("tests/test_reading_work.py", 'line.startswith(".venv/bin/jupyter nbconvert")'),
    "make exercises": Wraps("exercises", "scripts/make_exercises.py"),
    ".venv/bin/python scripts/make_exercises.py solutions/02_data_parallel.ipynb":
        Here("test_one_exercise_made_as_the_guide_says_is_the_committed_one"),
    ".venv/bin/python scripts/make_exercises.py --check": Here("test_the_exercise_check_as_the_guide_says"),
    "make site": Wraps("site", "scripts/build_site.py --out site"),
    ".venv/bin/python scripts/classroom_load.py --learners 10 --tries 3": Here("test_the_benchmarks_the_docs_show"),
    ".venv/bin/python scripts/classroom_load.py --learners N --tries 3": Here("test_the_benchmarks_the_docs_show"),
    "sudo .venv/bin/python scripts/classroom_load.py --hub --learners 10": Here("test_the_benchmarks_the_docs_show"),
    ".venv/bin/python scripts/bench_teardown.py --launches 70": Here("test_the_benchmarks_the_docs_show"),
    ".venv/bin/python scripts/launch_stress.py": Here("test_the_benchmarks_the_docs_show"),
    ".venv/bin/python scripts/bench_launch.py": Here("test_the_benchmarks_the_docs_show"),
    "make bench": Wraps("bench", "scripts/bench_launch.py"),
    "sudo .venv/bin/python scripts/bench_launch_servers.py --notebooks 8 --ranks 4 --limit 4G --only shared":
        By("tests/test_learner_memory.py", '"scripts/bench_launch_servers.py", "--notebooks", "8", "--ranks", "4",\n'
                                           '               "--limit", "4G", "--only", "shared"'),
    "sudo .venv/bin/python scripts/bench_launch_servers.py": Here("test_the_benchmarks_the_docs_show"),
    # maintainers and authors
    "make browser-deps": By(".ci/run", "timeout 900 make browser-deps"),
    "make slurm-up": By(".ci/run", "timeout 420 make slurm-up"),
    "make slurm-down": Wraps("slurm-down", "scripts/slurm_cluster.sh down"),
    "make test-quick": By("tests/test_setup.py", '["make", "-n", "--no-print-directory", "test-quick"]'),
    "make unit": Wraps("unit", "-m pytest tests -v"),
    "make notebook NB=notebooks/01_collectives.ipynb": Wraps("notebook NB=notebooks/01_collectives.ipynb",
                                                              "-m pytest notebooks/01_collectives.ipynb --nbval"),
    "make notebook NB=...": Wraps("notebook NB=notebooks/01_collectives.ipynb",
                                  "-m pytest notebooks/01_collectives.ipynb --nbval"),
    "make execute": Wraps("execute", "scripts/execute_notebooks.py notebooks solutions"),
    ".venv/bin/python scripts/execute_notebooks.py notebooks/NN_x.ipynb": Here("test_a_notebook_executed_and_stored"),
    ".venv/bin/python scripts/chapter_minutes.py --write": Here("test_the_minutes_written_as_the_guide_says"),
    ".venv/bin/python scripts/notebook_memory.py --measure notebooks/NN_x.ipynb": Here("test_a_notebooks_memory_measured"),
    "make lock": Wraps("lock", "uv pip compile pyproject.toml"),
    "make lock UPGRADE=--upgrade": Wraps("lock UPGRADE=--upgrade", "--upgrade -o requirements.lock"),
    "make test-oldest": Wraps("test-oldest", "--resolution lowest-direct"),
    "make test-latest": Wraps("test-latest", "RESOLUTION=--upgrade"),
    ".venv/bin/python scripts/flake_hunt.py --runs 3 --busy 2":
        By("tests/test_setup.py", '"flake_hunt.py", "--runs", "3", "--busy", "2"'),
    ".venv/bin/python scripts/gpu_check.py --jobs 8": Here("test_the_gpu_check_as_the_docs_show"),
    ".venv/bin/python scripts/test_durations.py .test-durations.jsonl --chapters":
        Here("test_the_chapter_table_as_the_testing_guide_says"),
    "torchrun --standalone --nproc-per-node=4 train.py": By("tests/test_torchrun_claims.py", "--standalone"),
}

MENTIONS = {
    ".venv/bin/jupyterhub-singleuser": "the program the hub starts for each learner, named in a sentence",
}


def doc_commands() -> dict[str, list[str]]:
    """{command: the pages that show it}: lines of bash blocks (a line ending in \\ joined with the
    next, comments after two spaces and # dropped) and command-like code spans of the prose."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        text = page.read_text()
        for language, body in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
            if language not in ("bash", "sh", "shell", "console"):
                continue
            for line in re.sub(r"\\\n\s*", " ", body).splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if line and not line.startswith("#"):
                    found.setdefault(" ".join(line.split()), []).append(page.name)
        for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
            if COMMAND_START.match(" ".join(span.split())):
                found.setdefault(" ".join(span.split()), []).append(page.name)
    return found


def test_every_command_the_docs_show_is_run_by_something():
    shown = doc_commands()
    unproven = {command: pages for command, pages in shown.items() if command not in PROOFS and command not in MENTIONS}
    assert not unproven, ("commands the docs show that nothing runs (add a proof to PROOFS in this file, or take "
                          f"them out of the docs): {unproven}")
    for command, proof in PROOFS.items():
        if isinstance(proof, By):
            assert proof.evidence in (REPO / proof.path).read_text(), f"{proof.path} no longer runs {command!r}"
        elif isinstance(proof, Here):
            assert callable(globals().get(proof.test)), f"{proof.test}, which runs {command!r}, is not in this file"
        else:
            recipe = subprocess.run(["make", "-n", "-B", "--no-print-directory", *shlex.split(proof.target)], cwd=REPO,
                                    capture_output=True, text=True, timeout=60, env=MAKE_ENV)
            assert recipe.returncode == 0 and proof.runs in recipe.stdout, (command, recipe.stdout[-2000:], recipe.stderr)
    stale = sorted(set(PROOFS) - set(shown))
    assert not stale, f"proofs of commands the docs no longer show (remove them): {stale}"


def test_the_catalogue_catches_a_command_nobody_runs(monkeypatch, tmp_path):
    page = tmp_path / "new.md"
    page.write_text("Then run `make everything-twice`, and\n\n```bash\n.venv/bin/python scripts/nowhere.py --all\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [*PAGES, page])
    with pytest.raises(AssertionError, match="nothing runs") as caught:
        test_every_command_the_docs_show_is_run_by_something()
    assert "make everything-twice" in str(caught.value) and "scripts/nowhere.py --all" in str(caught.value)


# --- the commands this file runs ----------------------------------------------------------------------

def scratch_course(tmp_path: Path, *copied: str) -> Path:
    """A course folder of its own: .venv linked, the named folders and files copied (a script that
    finds the course from its own file then writes here, not into the checkout)."""
    course = tmp_path / "course"
    course.mkdir()
    (course / ".venv").symlink_to(REPO / ".venv")
    for name in copied:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, course / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (course / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, course / name)
    return course


def run_as_written(command: str, cwd: Path, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def test_the_roster_line_writes_three_names(tmp_path):
    run = run_as_written('printf "ada\\ngrace\\nlinus\\n" > roster.txt', tmp_path)
    assert run.returncode == 0 and (tmp_path / "roster.txt").read_text().split() == ["ada", "grace", "linus"]


def test_the_cpu_wheels_choice_reaches_pip():
    recipe = subprocess.run(["make", "-n", "-B", "--no-print-directory", "setup",
                             "TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu"],
                            cwd=REPO, capture_output=True, text=True, timeout=60, env=MAKE_ENV)
    installs = [line for line in recipe.stdout.splitlines() if "pip install" in line and "torch" in line]
    assert installs and all("https://download.pytorch.org/whl/cpu" in line for line in installs), recipe.stdout


def test_the_exercise_check_as_the_guide_says():
    run = run_as_written(".venv/bin/python scripts/make_exercises.py --check", REPO, timeout=120)
    assert run.returncode == 0 and "exercises are up to date" in run.stdout, run.stdout + run.stderr


def test_one_exercise_made_as_the_guide_says_is_the_committed_one(tmp_path):
    course = scratch_course(tmp_path, "course_lib", "scripts/make_exercises.py", "solutions/02_data_parallel.ipynb")
    run = run_as_written(".venv/bin/python scripts/make_exercises.py solutions/02_data_parallel.ipynb", course, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    made = course / "exercises" / "02_data_parallel.ipynb"
    assert made.read_bytes() == (REPO / "exercises" / "02_data_parallel.ipynb").read_bytes()


def test_the_minutes_written_as_the_guide_says(tmp_path):
    course = scratch_course(tmp_path, "scripts/chapter_minutes.py", "scripts/execute_notebooks.py", "README.md",
                            "docs", "notebooks", "solutions", "course_lib")
    readme = course / "README.md"
    readme.write_text(re.sub(r"^(\| 01 \|.*\| )\d+( \|)$", r"\g<1>999\2", readme.read_text(), flags=re.M))
    assert "| 999 |" in readme.read_text()  # the README's minutes for chapter 01, now wrong
    run = run_as_written(".venv/bin/python scripts/chapter_minutes.py --write", course, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert readme.read_text() == (REPO / "README.md").read_text()
    assert (course / "docs" / "instructors.md").read_text() == (REPO / "docs" / "instructors.md").read_text()


def test_a_notebook_executed_and_stored(tmp_path):
    """CONTRIBUTING's command for one lesson, on a small notebook of a scratch course: it runs every cell,
    stores the outputs and records the run time. (--allow-busy: it waits for an idle machine otherwise, and
    a machine running the test suite is not one.)"""
    import nbformat

    course = scratch_course(tmp_path, "scripts/execute_notebooks.py", "scripts/notebook_memory.py", "course_lib", "docs")
    (course / "notebooks").mkdir()
    lesson = course / "notebooks" / "NN_x.ipynb"
    cells = ["print(6 * 7)", "import time\nprint('waiting', flush=True)\ntime.sleep(1.5)\nprint('done')"]
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text) for text in cells]), lesson)
    run = run_as_written(".venv/bin/python scripts/execute_notebooks.py notebooks/NN_x.ipynb --allow-busy", course)
    assert run.returncode == 0, run.stdout + run.stderr
    assert nbformat.read(lesson, 4).cells[0].outputs[0]["text"] == "42\n"
    recorded = json.loads((course / "docs" / "run_times.json").read_text())["notebooks/NN_x.ipynb"]
    # the longest time nothing new showed: the second cell's sleep, between its two lines
    assert recorded["longest silence at cell"] == 1, recorded
    assert 1.5 <= recorded["longest silence s"] < 4, recorded


def test_a_notebooks_memory_measured(tmp_path):
    """CONTRIBUTING's command on a small notebook of a scratch course: its peak recorded, and the README's
    sentence (set by the course's largest peak, far above this notebook's) kept."""
    import nbformat

    course = scratch_course(tmp_path, "scripts/notebook_memory.py", "scripts/execute_notebooks.py", "course_lib", "docs",
                            "README.md")
    (course / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")]),
                   course / "notebooks" / "NN_x.ipynb")
    readme = (course / "README.md").read_text()
    run = run_as_written(".venv/bin/python scripts/notebook_memory.py --measure notebooks/NN_x.ipynb", course)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((course / "docs" / "notebook_memory.json").read_text())["notebooks/NN_x.ipynb"]
    assert (course / "README.md").read_text() == readme


def course_with_a_class_of_one(tmp_path: Path) -> Path:
    """A scratch course whose SUBMISSIONS hold ada's chapter 01 exercise, handed in untouched."""
    course = scratch_course(tmp_path, "course_lib", "scripts/grade.py", "solutions/01_collectives.ipynb",
                            "exercises/01_collectives.ipynb", "jupyter")
    (course / "SUBMISSIONS" / "ada").mkdir(parents=True)
    shutil.copy(REPO / "exercises" / "01_collectives.ipynb", course / "SUBMISSIONS" / "ada")
    return course


def test_grading_a_class_as_the_guide_says(tmp_path):
    """docs/grading.md's command in a scratch course with a class of one, whose chapter 01 exercise is
    handed in untouched: graded, nothing earned, and a feedback file that says why."""
    course = course_with_a_class_of_one(tmp_path)
    run = run_as_written(".venv/bin/python scripts/grade.py SUBMISSIONS", course, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    grades = (course / "SUBMISSIONS" / "grades.csv").read_text().splitlines()
    assert len(grades) == 2 and grades[1].startswith("ada,"), grades
    assert "FAILED" in (course / "SUBMISSIONS" / "ada" / "feedback.txt").read_text()


def test_the_gpu_check_as_the_docs_show():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU check is a maintainer's run of many minutes (docs/platforms.md)")
    run = run_as_written(".venv/bin/python scripts/gpu_check.py --jobs 8", REPO, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("no GPU: nothing checked"), run.stdout + run.stderr


# Runs a script until its argument parser has parsed its arguments (an error there exits 2), then stops.
PARSE_ONLY = """import argparse, runpy, sys
parse = argparse.ArgumentParser.parse_args
def parse_and_stop(self, args=None, namespace=None):
    parse(self, args, namespace)
    print("parsed")
    sys.exit(0)
argparse.ArgumentParser.parse_args = parse_and_stop
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

def test_the_chapter_table_as_the_testing_guide_says(tmp_path):
    course = scratch_course(tmp_path, "scripts/test_durations.py")
    (course / ".test-durations.jsonl").write_text("\n".join(json.dumps(entry) for entry in [
        {"stage": "s", "test": None, "seconds": 100.0},
        {"stage": "s", "test": "notebooks/03_ddp.ipynb::Cell 4", "seconds": 3.0, "test_cpu_seconds": 2.0},
        {"stage": "s", "test": "solutions/03_ddp.ipynb::Cell 2", "seconds": 9.0, "test_cpu_seconds": 7.0}]) + "\n")
    run = run_as_written(".venv/bin/python scripts/test_durations.py .test-durations.jsonl --chapters", course)
    assert run.returncode == 0 and "| 03 | - | 2 | 7 | 9 | 12 |" in run.stdout, run.stdout + run.stderr


BENCHMARKS = {  # the script, the docs' arguments (each must parse), and the smallest run of it
    "bench_launch.py": ([[]], ["--world-size", "2", "--repeats", "1"]),
    "bench_teardown.py": ([["--launches", "70"]], ["--launches", "1", "--learners", "1", "--busy", "0"]),
    "launch_stress.py": ([[]], ["--learners", "1", "--rounds", "1", "--busy", "0", "--ranks", "2"]),
    "bench_launch_servers.py": ([[]], None),  # its smallest run, 8 kernels in a cgroup: tests/test_learner_memory.py
    "classroom_load.py": ([["--learners", "10", "--tries", "3"], ["--hub", "--learners", "10"]], None),
}


@pytest.mark.parametrize("script", sorted(BENCHMARKS))
def test_the_benchmarks_the_docs_show(script, tmp_path):
    """Each benchmark's parser accepts the arguments the docs give it, and the benchmark runs at its smallest
    (classroom_load: one learner on a one-cell notebook; its --hub run needs a hub and is tested in test_hub.py)."""
    shown, smallest = BENCHMARKS[script]
    documented = [command for command in PROOFS if f"scripts/{script}" in command]
    assert documented, script
    for arguments in shown:
        parsed = subprocess.run([str(PYTHON), "-c", PARSE_ONLY, f"scripts/{script}", *arguments],
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        assert parsed.returncode == 0 and parsed.stdout.endswith("parsed\n"), (script, arguments, parsed.stderr)
    if script == "bench_launch_servers.py":
        return
    if smallest is None:
        import nbformat

        notebook = tmp_path / "one_launch.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "from course_lib import launch\nimport torch.distributed as dist\n"
            "print(launch(lambda: dist.get_rank(), 2, show_output=False))")]), notebook)
        smallest = ["--learners", "1", "--tries", "1", "--notebooks", str(notebook)]
    run = subprocess.run([str(PYTHON), f"scripts/{script}", *smallest], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, (script, run.stdout[-3000:], run.stderr[-3000:])
