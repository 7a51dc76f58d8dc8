"""Grading a class on a Slurm cluster: a job array, each task grading a share of the students.

Introduced with the instructors' guide's "More than one server" (docs/instructors.md). One machine
grades a class of a few dozen; 200 learners x 11 notebooks is hours of it. ``course-grade
SUBMISSIONS --slurm`` spreads the class over the cluster's nodes and writes the same grades.csv and
feedback files as a one-machine run, byte for byte:

1. **Plan.** The students are dealt into ``--slurm-tasks`` shares, in order (student k to share
   k mod N). A run folder, ``SUBMISSIONS/.slurm-grading-<run id>/`` (the instructor's alone: mode
   0700), holds the plan, this run's secret (every task draws the same hidden cases, so a task grades
   a student exactly as one machine would) and each task's log and results.
2. **Submit** one job array; task i runs ``python -m course_lib.grading.on_slurm RUN_FOLDER`` on its
   node and grades share i with the grader of one machine (``grader.grade_class``: its sandboxes,
   judges and batches; ``--jobs`` at once, as many cores as it asks Slurm for), then writes its
   results to ``task-<i>.json``, whole or not at all.
3. **Wait** until no task of the array is queued or running. The shares with no results are
   submitted again, once.
4. **Merge** every task's results and write the grades and the feedback with the same functions as a
   one-machine run. The students of a share that failed twice get "not graded", with what its task
   said last. Nothing is lost when the instructor's terminal closes: the array runs on, and
   ``course-grade --slurm-resume RUN_FOLDER`` waits for it, retries what failed (once in all) and merges.

Every node must see the course, the submissions and the run folder at the same paths (a shared
file system, as on any cluster), and must be able to make the grader's sandbox (bubblewrap).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .merging import Check, load_reference
from .scoring import CheckResult, NotebookResult, not_graded

RUN_PREFIX = ".slurm-grading-"
PLAN, SECRET, ATTEMPTS = "plan.json", "secret", "attempts.json"
POLL_S = 2.0
# The options a task takes from the instructor's command line (paths as absolute strings).
TASK_OPTIONS = ("submissions", "solutions", "exercises", "csv", "keep_work", "jobs", "max_batch", "cell_timeout",
                "setup_timeout", "no_sandbox", "run_id", "sbatch_option")


# --------------------------------------------------------------------------
# 1. Plan
# --------------------------------------------------------------------------
def shares_of(students: list[str], tasks: int) -> list[list[str]]:
    """Student k goes to share k mod ``tasks``: as even as shares can be, none empty."""
    tasks = max(1, min(tasks, len(students)))
    return [students[k::tasks] for k in range(tasks)]


def write_plan(options, students: list[str], names: list[str], maxima: dict[str, float]) -> Path:
    """The run folder, with the plan and the secret, readable by the instructor alone."""
    run = options.submissions / f"{RUN_PREFIX}{options.run_id}"
    run.mkdir(mode=0o700)
    saved = {name: value for name, value in vars(options).items() if name in TASK_OPTIONS}
    paths = [name for name, value in saved.items() if isinstance(value, Path)]
    saved |= {name: str(saved[name]) for name in paths}
    plan = {"options": saved, "paths": paths, "students": students, "names": names, "maxima": maxima,
            "shares": shares_of(students, options.slurm_tasks)}
    write_private(run / PLAN, json.dumps(plan, indent=1))  # ensure_ascii: any student name survives
    write_private(run / SECRET, options.secret + "\n")
    return run


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (a reader never sees half of it), mode 0600."""
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)


def read_plan(run: Path) -> dict:
    plan = json.loads((run / PLAN).read_text(encoding="utf-8"))
    plan["options"]["secret"] = (run / SECRET).read_text().strip()
    return plan


def plan_options(plan: dict) -> argparse.Namespace:
    options = argparse.Namespace(**plan["options"])
    for name in plan["paths"]:
        setattr(options, name, Path(getattr(options, name)))
    options.work_root = str(options.keep_work) if options.keep_work else None
    return options


# --------------------------------------------------------------------------
# 2. Submit, 3. wait
# --------------------------------------------------------------------------
def batch_script(run: Path) -> str:
    """What each task of the array runs: this module, on the run folder, with the task's index."""
    return ("#!/bin/bash\n"
            "# Written by course-grade --slurm: one task of the class's grading (course_lib/grading/on_slurm.py).\n"
            f"exec {shlex.quote(sys.executable)} -m course_lib.grading.on_slurm {shlex.quote(str(run))} "
            '"$SLURM_ARRAY_TASK_ID"\n')


def submit_shares(run: Path, shares: list[int], cpus: int, sbatch_options: list[str]) -> str:
    """sbatch a job array of ``shares``; its job id. Each attempt is counted in the run folder first."""
    attempts = read_attempts(run)
    for share in shares:
        attempts[str(share)] = attempts.get(str(share), 0) + 1
    write_private(run / ATTEMPTS, json.dumps(attempts))
    script = run / "task.sbatch"
    write_private(script, batch_script(run))
    repo = Path(__file__).resolve().parents[2]
    log = str(run / "task-%a.log").replace("%", "%%").replace("%%a.log", "%a.log")  # a % of the path kept as it is
    command = ["sbatch", "--parsable", "--job-name=course-grade", f"--array={','.join(map(str, shares))}",
               f"--cpus-per-task={cpus}", f"--chdir={repo}", f"--output={log}", "--open-mode=append",
               *sbatch_options, str(script)]
    submitted = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if submitted.returncode != 0:
        raise RuntimeError(f"sbatch refused the grading job: {submitted.stderr.strip() or submitted.stdout.strip()}")
    job_id = submitted.stdout.strip().split(";")[0]
    with open(run / "jobs", "a") as f:  # every job of this run, for --slurm-resume to wait for
        f.write(job_id + "\n")
    return job_id


def read_attempts(run: Path) -> dict[str, int]:
    path = run / ATTEMPTS
    return json.loads(path.read_text()) if path.exists() else {}


def still_queued(job_id: str) -> bool:
    """True while any task of the job is pending, running or completing."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:  # an id squeue no longer knows: the job ended long ago
        if "Invalid job id" in out.stderr:
            return False
        raise RuntimeError(f"squeue failed: {out.stderr.strip()}")
    return bool(out.stdout.strip())


def wait_for(run: Path, job_ids: list[str], shares: int) -> None:
    """Until no task of these jobs is queued; a line each time another share's results arrive."""
    done = -1
    while True:
        queued = [job for job in job_ids if still_queued(job)]
        now = len(finished_shares(run, shares))
        if now != done:
            print(f"  {now} of {shares} shares graded" + (f"; waiting for job {', '.join(queued)}" if queued else ""),
                  flush=True)
            done = now
        if not queued:
            return
        time.sleep(POLL_S)


def finished_shares(run: Path, shares: int) -> list[int]:
    return [share for share in range(shares) if (run / f"task-{share}.json").exists()]


# --------------------------------------------------------------------------
# A task, on its node
# --------------------------------------------------------------------------
def run_task(run: Path, share: int) -> int:
    """Grade share ``share`` of the plan in ``run`` as one machine would; its results, whole."""
    from .grader import grade_class, one_at_a_time_unless_cpu_is_shared  # the grader imports this module
    from .sandbox import sandbox_problem

    # scancel, or a time limit, sends SIGTERM: end as an interrupt does, the judges stopped and their
    # sandboxes removed, rather than leave them on the node.
    signal.signal(signal.SIGTERM, _interrupt)
    plan = read_plan(run)
    options = plan_options(plan)
    # Its own run id: two tasks on one node must not remove each other's sandboxes when they end.
    options.run_id = f"{options.run_id}-{share}"
    students = plan["shares"][share]
    if not options.no_sandbox:
        problem = sandbox_problem()
        if problem:
            print(f"course-grade task {share}: cannot grade on {os.uname().nodename}: {problem}", file=sys.stderr)
            return 2
        one_at_a_time_unless_cpu_is_shared(options)
    references = {name: load_reference(options.solutions / name) for name in plan["names"]}
    print(f"task {share} on {os.uname().nodename}: {len(students)} students x {len(plan['names'])} notebooks, "
          f"{options.jobs} at once", flush=True)
    table = grade_class(students, plan["names"], references, options)
    if table is None:
        return 130
    write_private(run / f"task-{share}.json", json.dumps([asdict(result) for result in table.values()]))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


# --------------------------------------------------------------------------
# 4. Merge
# --------------------------------------------------------------------------
def result_from(data: dict) -> NotebookResult:
    checks = [CheckResult(Check(**c["check"]), c["earned"], c["message"]) for c in data.pop("checks")]
    return NotebookResult(**data, checks=checks)


def last_words(run: Path, share: int) -> str:
    """What a failed task said last (its log's last line), or that it said nothing."""
    log = run / f"task-{share}.log"
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()] if log.exists() else []
    return f"its task said: {lines[-1].strip()[:300]}" if lines else "its task ended without a word"


def merged_table(run: Path, plan: dict) -> dict[tuple[str, str], NotebookResult]:
    table = {}
    for share, students in enumerate(plan["shares"]):
        path = run / f"task-{share}.json"
        if path.exists():
            for data in json.loads(path.read_text(encoding="utf-8")):
                result = result_from(data)
                table[result.student, result.name] = result
            continue
        why = last_words(run, share)
        for student in students:
            for name in plan["names"]:
                result = NotebookResult(student, name, plan["maxima"][name])
                result.sandboxed = not plan["options"]["no_sandbox"]
                not_graded(result, f"not graded: its grading task on Slurm failed twice ({why}); ask your "
                                   "instructor to grade it again")
                table[student, name] = result
    return table


# --------------------------------------------------------------------------
# The instructor's side: grade, or resume a run
# --------------------------------------------------------------------------
def grade_on_slurm(options, students: list[str], names: list[str], maxima: dict[str, float]):
    """Plan, submit, wait, retry and merge; the run's folder and the class's table (None if interrupted)."""
    run = write_plan(options, students, names, maxima)
    shares = len(shares_of(students, options.slurm_tasks))
    job = submit_shares(run, list(range(shares)), options.jobs, options.sbatch_option)
    try:
        print(f"submitted job {job}: {shares} task{'s' * (shares != 1)}, {options.jobs} cores each; the run's "
              f"folder is {run}", flush=True)
        return run, finish_run(run, options.jobs, options.sbatch_option)[1]
    except KeyboardInterrupt:
        say_how_to_resume(run)
        return None
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # squeue or sbatch failed, say
        raise RuntimeError(f"{exc}. The job array goes on; once Slurm answers again, wait for it and write the "
                           f"grades with: course-grade --slurm-resume {shlex.quote(str(run))}") from exc


def finish_run(run: Path, cpus: int, sbatch_options: list[str]):
    """Wait for the run's jobs, submit again (once) the shares that left no results, wait; the plan and
    the merged table."""
    plan = read_plan(run)
    shares = len(plan["shares"])
    wait_for(run, read_jobs(run), shares)
    finished, attempts = set(finished_shares(run, shares)), read_attempts(run)
    again = [share for share in range(shares) if share not in finished and attempts.get(str(share), 0) < 2]
    if again:
        job = submit_shares(run, again, cpus, sbatch_options)
        print(f"share(s) {', '.join(map(str, again))} left no results ({last_words(run, again[0])}): "
              f"submitted again as job {job}", flush=True)
        wait_for(run, [job], shares)
    return plan, merged_table(run, plan)


def say_how_to_resume(run: Path) -> None:
    print(f"\ninterrupted: nothing written. The job array goes on; to wait for it and write the grades, run\n"
          f"  course-grade --slurm-resume {shlex.quote(str(run))}\n"
          f"(to stop it instead: scancel {' '.join(read_jobs(run))})", file=sys.stderr, flush=True)


def read_jobs(run: Path) -> list[str]:
    path = run / "jobs"
    return path.read_text().split() if path.exists() else []


def remove_run(run: Path) -> None:
    """The run folder, once the grades are written: it holds the secret and the hidden cases' results."""
    shutil.rmtree(run, ignore_errors=True)


def is_run_folder(path: Path) -> bool:
    return bool(re.fullmatch(re.escape(RUN_PREFIX) + r"[0-9a-f]+", path.name)) and (path / PLAN).is_file()


if __name__ == "__main__":  # a task of the array: python -m course_lib.grading.on_slurm RUN_FOLDER SHARE
    sys.exit(run_task(Path(sys.argv[1]), int(sys.argv[2])))
