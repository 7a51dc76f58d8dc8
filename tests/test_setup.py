"""The course's set-up files agree with each other and with what is installed."""

import os
import re
import subprocess
import sysconfig
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]


def pyproject_requirements() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [req for group in project["optional-dependencies"].values() for req in group]
    return {str(Requirement(req)) for req in project["dependencies"] + extras}


def environment_yml_requirements() -> set[str]:
    lines = (REPO / "environment.yml").read_text().splitlines()
    start = lines.index("  - pip:") + 1
    pip_lines = [line.strip()[2:] for line in lines[start:] if re.match(r"^\s{6}- ", line)]
    return {str(Requirement(req)) for req in pip_lines if not req.startswith(("-e", "-c"))}


def test_environment_yml_and_pyproject_list_the_same_packages():
    in_pyproject, in_conda = pyproject_requirements(), environment_yml_requirements()
    assert in_pyproject == in_conda, (
        f"only in pyproject.toml: {sorted(in_pyproject - in_conda)}; "
        f"only in environment.yml: {sorted(in_conda - in_pyproject)}"
    )


def hand_pins() -> dict[str, Version]:
    """constraints.txt: the versions pinned by hand."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            pins[pin.name] = Version(str(next(iter(pin.specifier)).version))
    return pins


def optional_packages() -> set[str]:
    """What only an extra other than `test` installs (make browser-deps, make hub): maybe not here."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return {Requirement(req).name for name, group in extras.items() if name != "test" for req in group}


def test_pinned_versions_satisfy_the_supported_ranges_and_are_installed():
    ranges = {Requirement(r).name: Requirement(r).specifier for r in pyproject_requirements()}
    for name, pinned in hand_pins().items():
        # an indirect dependency pinned by hand (constraints.txt says why) has no range of ours to be in
        assert name not in ranges or pinned in ranges[name], f"{name}=={pinned} is outside pyproject's {ranges[name]}"
        try:
            installed = Version(version(name))
        except PackageNotFoundError:  # an extra this environment was made without (make setup alone)
            assert name in optional_packages(), f"{name} is pinned but not installed"
            continue
        assert installed.release == pinned.release, f"installed {name} differs from {pinned}"


def test_torch_and_torchvision_import_together():
    import torch
    import torchvision
    from torchvision.ops import nms  # fails when torchvision was built for another torch

    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.9]])
    assert nms(boxes, torch.tensor([0.9, 0.8]), 0.5).tolist() == [0]
    assert torchvision.__version__


def test_ci_runs_the_readme_test_command():
    assert "make test" in (REPO / ".ci" / "run").read_text()
    assert "make test" in (REPO / "README.md").read_text()


# Installed, but not by the lock: the course itself (pip install -e .), the installer, and the tool
# `make lock` runs (installed by that target only).
NOT_LOCKED = {"course-lib", "pip", "uv"}


def locked_versions() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate():
                pins[canonicalize_name(requirement.name)] = str(next(iter(requirement.specifier)).version)
    return pins


def installed_distributions():
    """What pip installed into this environment: its site-packages only. sys.path is no guide, since
    importing setuptools appends setuptools/_vendor (its private copies of wheel, zipp, tomli, ...) to
    it, and whether anything imported setuptools first depends on which tests ran before."""
    from importlib.metadata import distributions

    site_packages = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return distributions(path=site_packages)


def test_every_installed_distribution_is_the_locked_version():
    """make setup, browser-deps and hub-deps install from requirements.lock: nothing in the course's
    environment may come from anywhere else, at any other version."""
    pins = locked_versions()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in installed_distributions()}
    unlocked = sorted(set(installed) - set(pins) - NOT_LOCKED)
    assert not unlocked, f"installed but not in requirements.lock (run `make lock`): {unlocked}"
    different = {name: (version, pins[name]) for name, version in installed.items()
                 if name in pins and Version(version).public != Version(pins[name]).public}  # 2.15.0+cpu is 2.15.0
    assert not different, f"installed version differs from requirements.lock's: {different}"


def test_the_lock_holds_the_hand_chosen_pins():
    locked = locked_versions()
    for name, pinned in hand_pins().items():
        assert Version(locked[canonicalize_name(name)]) == pinned, f"{name}=={pinned}"


def _old_python(folder: Path) -> Path:
    """Stands in for the Python 3.10 of Ubuntu 22.04: says its version, fails the course's version check."""
    python = folder / "python3.10"
    python.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Python 3.10.12"; exit 0; fi\nexit 1\n')
    python.chmod(0o755)
    return python


def test_a_python_too_old_gets_one_line_saying_what_to_do_and_no_venv(tmp_path):
    import subprocess

    venv = tmp_path / ".venv"
    run = subprocess.run(["make", "-s", "setup", f"PYTHON={_old_python(tmp_path)}", f"VENV={venv}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    said = run.stdout.strip().splitlines()
    assert len(said) == 1 and "needs Python 3.11 or newer" in said[0] and "Python 3.10.12" in said[0], said
    assert "PYTHON=python3.11" in said[0]
    assert not venv.exists()


def test_a_venv_made_by_an_older_python_is_made_again_not_reused(tmp_path):
    import subprocess

    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(_old_python(tmp_path))
    run = subprocess.run(["make", "-s", "setup", f"PYTHON={_old_python(tmp_path)}", f"VENV={venv}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert "making it again" in run.stdout and "needs Python 3.11 or newer" in run.stdout, run.stdout + run.stderr
    assert not venv.exists()


def test_the_durations_table_shows_each_tests_cpu_where_it_was_counted():
    import importlib.util

    spec = importlib.util.spec_from_file_location("durations_table", REPO / "scripts" / "test_durations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.table

    run = {"stage": "s", "test": None, "seconds": 120.0, "cpu_seconds": 60.0, "outcome": "passed"}
    counted = [run, {"stage": "s", "test": "tests/a.py::one", "seconds": 30.0, "test_cpu_seconds": 90.0},
               {"stage": "s", "test": "tests/a.py::two", "seconds": 50.0, "test_cpu_seconds": 6.0},
               {"stage": "s", "test": "tests/b.py::three", "seconds": 40.0, "test_cpu_seconds": 30.0}]
    shown = table(counted, top=5)
    assert "each pytest worker's cgroup): 2.1 min" in shown  # 126 CPU-seconds in all
    assert "  1.3 min    1.6 min CPU  tests/a.py  [s]" in shown  # 80 s of wall, 96 CPU-seconds
    used_most = shown[shown.index("that used the most CPU"):].splitlines()[1:4]
    assert [line.split()[-2] for line in used_most] == ["tests/a.py::one", "tests/b.py::three", "tests/a.py::two"]
    plain = table([run] + [{k: v for k, v in e.items() if k != "test_cpu_seconds"} for e in counted[1:]], top=5)
    assert "CPU  tests/" not in plain and "used the most CPU" not in plain


def test_the_durations_table_splits_the_cpu_by_chapter():
    import importlib.util

    spec = importlib.util.spec_from_file_location("durations_table", REPO / "scripts" / "test_durations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entries = [{"stage": "s", "test": None, "seconds": 100.0},
               {"stage": "s", "test": "tests/test_browser.py::test_lesson_runs_in_jupyterlab_as_stored[03_ddp.ipynb]",
                "seconds": 40.0, "test_cpu_seconds": 30.0},
               {"stage": "s", "test": "notebooks/03_ddp.ipynb::Cell 4", "seconds": 3.0, "test_cpu_seconds": 2.0},
               {"stage": "s", "test": "notebooks/03_ddp.ipynb::Cell 5", "seconds": 3.0, "test_cpu_seconds": 2.5},
               {"stage": "s", "test": "solutions/11_putting_it_together.ipynb::Cell 2", "seconds": 9.0,
                "test_cpu_seconds": 7.0},
               {"stage": "s", "test": "tests/test_chapter_exercises.py::test_grading_rewards_right_answers_and_only_"
                                      "them[01_collectives]", "seconds": 600.0, "test_cpu_seconds": 800.0},
               {"stage": "s", "test": "tests/test_launch.py::test_x", "seconds": 5.0, "test_cpu_seconds": 4.0}]
    rows = {line.split(" | ")[0].strip("| "): line for line in module.chapter_table(entries).splitlines()}
    assert rows["03"] == "| 03 | 30 | 4 | - | 34 | 46 |"  # 2.0 + 2.5 rounds to 4
    assert rows["11"] == "| 11 | - | - | 7 | 7 | 9 |"
    assert rows["grading every chapter's test submissions (one grade.py run)"].endswith("| 800 | 600 |")
    assert rows["the rest (library, grader, sandbox, hub, Slurm, tools)"].endswith("| 4 | 5 |")


def test_make_test_quick_runs_the_library_chapter_01_and_a_small_class():
    """What `make test-quick` (CONTRIBUTING, docs/testing.md) runs, read from make itself (a dry run: the
    whole of it is `make test`'s too)."""
    # As run by `make test` too: a make inside make prints "Entering directory" lines unless told not to.
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run = subprocess.run(["make", "-n", "--no-print-directory", "test-quick"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    commands = [line for line in run.stdout.replace("\\\n", " ").splitlines() if "-m pytest" in line]
    assert len(commands) == 1, run.stdout
    command = commands[0]
    for part in ("-m pytest tests", "notebooks/01_collectives.ipynb", "solutions/01_collectives.ipynb", "--nbval"):
        assert part in command, command
    for left_out in ("test_browser", "test_chapter_exercises", "test_hub"):
        assert f"--ignore=tests/{left_out}.py" in command, command
    ignored = re.findall(r"--ignore=(\S+)", command)
    assert ignored and all((REPO / path).exists() for path in ignored), ignored  # no name that has gone
    assert "--ignore=tests/test_grading.py" not in command  # the small class it grades


def _into_the_root_cpu_cgroup():  # as a pytest outside `make test`'s own cgroups starts
    Path("/sys/fs/cgroup/cpuacct/cgroup.procs").write_text(str(os.getpid()))


def test_each_pytest_worker_counts_its_tests_cpu_in_a_cgroup_of_its_own(tmp_path):
    """conftest.py, run with two xdist workers as `make test` runs it: each test's line holds the CPU
    its own process used, the controller (which runs no test) keeps no cgroup to which the workers'
    CPU would go, and no cgroup is left behind."""
    import json
    import shutil
    import subprocess
    import sys

    import pytest

    procs = Path("/sys/fs/cgroup/cpuacct/cgroup.procs")
    if not (hasattr(os, "geteuid") and os.geteuid() == 0 and procs.exists()):
        pytest.skip("per-test CPU is counted only as root on a Linux with cgroup v1's cpuacct controller")
    probe = procs.parent / f"course-tests-probe-{os.getpid()}"
    try:  # a read-only cgroup file system (some containers) counts nothing either
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        pytest.skip(f"cpuacct cgroups cannot be made here ({exc}), so per-test CPU is not counted")
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_work.py").write_text(
        "import time\n\n\n"
        "def test_burns_a_cpu_second():\n"
        "    start = time.process_time()\n"
        "    while time.process_time() - start < 1.0:\n"
        "        pass\n\n\n"
        "def test_sleeps_a_second():\n"
        "    time.sleep(1.0)\n")
    durations = tmp_path / "durations.jsonl"
    cgroups_before = set(procs.parent.glob("course-tests-*"))
    env = dict(os.environ, COURSE_DURATIONS_FILE=str(durations), COURSE_TEST_STAGE="inner",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # xdist alone: nbval's imports would only cost time
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-n", "2", "-p", "no:cacheprovider",
                          "-c", os.devnull,
                          "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300, preexec_fn=_into_the_root_cpu_cgroup)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = {line["test"]: line for line in map(json.loads, durations.read_text().splitlines())}
    burns, sleeps = (lines[f"test_work.py::{name}"] for name in ("test_burns_a_cpu_second", "test_sleeps_a_second"))
    assert 1.0 <= burns.get("test_cpu_seconds", 0) < burns["seconds"] + 0.5, burns  # its own CPU, no one else's
    assert sleeps.get("test_cpu_seconds", 9) < 0.5, sleeps  # a second of sleep costs next to no CPU
    assert set(procs.parent.glob("course-tests-*")) <= cgroups_before  # the workers' went when they ended


def skip_unless_a_git_clone():
    import pytest

    if not (REPO / ".git").exists():
        pytest.skip("the flake hunt clones this repository, and this copy of the course is not a git clone")


def assert_the_hunt_left_nothing(run_pid: int, hunt_pid: int, what: str) -> None:
    """The run's process (``run_pid``) and the hunt's busy loops are gone once the hunt has ended."""
    import time

    import psutil
    from processes import alive

    deadline = time.monotonic() + 5  # SIGKILL takes effect a moment later
    while alive(run_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(run_pid), what
    ours = f"busy beside flake hunt {hunt_pid}"
    assert not [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and ours in p.info["cmdline"]]


def test_the_flake_hunt_runs_each_time_beside_busy_loops_and_lists_what_ever_failed(tmp_path):
    """scripts/flake_hunt.py with a stand-in for the suite: a run that passes, one with a failed test, one
    that hangs. The busy loops run during each run and are gone after; the hung run is stopped, its
    processes too; the failed test is listed with how often it failed."""
    import subprocess
    import sys

    skip_unless_a_git_clone()
    counter, sleeper, hunt = tmp_path / "runs", tmp_path / "sleeper.pid", tmp_path / "hunt.pid"
    stand_in = (
        'n=$(( $(cat "$COUNTER" 2>/dev/null || echo 0) + 1 )); echo $n > "$COUNTER"\n'
        'echo $PPID > "$HUNT"; echo "busy loops: $(pgrep -fc "[b]usy beside flake hunt $PPID$")"\n'
        'if [ $n = 2 ]; then echo "FAILED tests/test_x.py::test_flaky[as run] - AssertionError: 1 - 2"\n'
        '  echo "===== 1 failed, 3 passed in 2.00s ====="; exit 1; fi\n'
        'if [ $n = 3 ]; then sleep 300 & echo $! > "$SLEEPER"; wait; fi\n'
        'echo "===== 4 passed in 2.00s ====="\n')
    env = dict(os.environ, COUNTER=str(counter), SLEEPER=str(sleeper), HUNT=str(hunt))
    run = subprocess.run([sys.executable, REPO / "scripts" / "flake_hunt.py", "--runs", "3", "--busy", "2",
                          "--command", stand_in, "--run-timeout-min", "0.1", "--keep", tmp_path / "hunt"],
                         env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert re.search(r"^run 1: exit 0 after [\d.]+ min: 4 passed in 2.00s$", out, re.M), out
    assert re.search(r"^run 2: exit 1 after [\d.]+ min: 1 failed, 3 passed in 2.00s\n    failed: tests/test_x.py::test_flaky\[as run\]$",
                     out, re.M), out
    assert re.search(r"^run 3: stopped at the timeout after [\d.]+ min: no pytest summary$", out, re.M), out
    assert "1 of 3 runs passed" in out and "  tests/test_x.py::test_flaky[as run]: failed in 1 of 3 runs" in out, out
    logs = [(tmp_path / "hunt" / f"run{n}.log").read_text() for n in (1, 2, 3)]
    assert all("busy loops: 2\n" in log for log in logs), logs
    assert_the_hunt_left_nothing(int(sleeper.read_text()), int(hunt.read_text()), "the hung run's processes outlived it")


def test_a_flake_hunt_stopped_by_kill_leaves_no_run_or_busy_loop_behind(tmp_path):
    """`kill` of scripts/flake_hunt.py during a run: the run's processes and the busy loops end with it."""
    import signal
    import subprocess
    import sys
    import time

    skip_unless_a_git_clone()
    sleeper = tmp_path / "sleeper.pid"
    hunt = subprocess.Popen([sys.executable, REPO / "scripts" / "flake_hunt.py", "--runs", "2", "--busy", "2",
                             "--command", 'sleep 300 & echo $! > "$SLEEPER"; wait', "--keep", tmp_path / "hunt"],
                            env=dict(os.environ, SLEEPER=str(sleeper)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (sleeper.exists() and sleeper.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    hunt.send_signal(signal.SIGTERM)
    out, _ = hunt.communicate(timeout=30)
    assert hunt.returncode == 1 and "flake hunt stopped by signal 15" in out, out
    assert_the_hunt_left_nothing(int(sleeper.read_text()), hunt.pid, "the run's processes outlived the hunt")


def test_the_setup_benchmark_times_what_make_setup_installs(tmp_path):
    """scripts/bench_setup.py's two installs are `make setup`'s: the same lock, constraints, extras and the
    uv the Makefile pins; `make -n setup` shows uv doing the install."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_setup", REPO / "scripts" / "bench_setup.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    locked = ["-c", "constraints.txt", "-c", "requirements.lock", "-e", ".[test,ft]"]
    for installer in ("pip", "uv"):
        *_, install = bench.install_commands(installer, tmp_path / installer, "test,ft")
        assert install[-len(locked):] == locked, install
    pinned = re.search(r"^UV_VERSION := (\S+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert bench.install_commands("uv", tmp_path, "")[0][-1] == f"uv=={pinned}"
    recipe = subprocess.run(["make", "-n", "-B", "--no-print-directory", "setup"], cwd=REPO, capture_output=True,
                            text=True, timeout=60).stdout
    # --compile-bytecode, as pip does: the launcher's ranks run with -B, and without .pyc files each would compile
    # every module it imports (torch's thousands) each time it starts (seen: a whole CI run far slower)
    installs = [line for line in recipe.splitlines() if "uv pip install" in line]
    assert installs and all("--compile-bytecode" in line for line in installs), recipe
    assert re.search(r"\.venv/bin/uv pip install --compile-bytecode --python \.venv/bin/python -c constraints\.txt "
                     r"-c requirements\.lock -e \"\.\[test,ft\]\"", recipe), recipe
    assert "--compile-bytecode" in bench.install_commands("uv", tmp_path, "")[-1]
