"""Grade a class's exercise notebooks: a score table, grades.csv and one feedback file per student.

The grader's command line (introduced with chapter 01's exercises), beside the judge, the sandbox
and the verdicts plugin it runs. Usage (``course-grade`` once the course is installed, or
``.venv/bin/python scripts/grade.py``):
    course-grade SUBMISSIONS [--jobs N] [--cell-timeout S] [--setup-timeout S] [--solutions DIR] [--exercises DIR]
    course-grade SUBMISSIONS --slurm [--slurm-tasks N] [--sbatch-option OPTION ...]   (a job array: on_slurm.py)
    course-grade --slurm-resume RUN_FOLDER

Layout: ``SUBMISSIONS/<student>/<name>.ipynb``, where ``<name>.ipynb`` is the file name of an
exercise notebook in exercises/. Writes ``SUBMISSIONS/grades.csv`` and
``SUBMISSIONS/<student>/feedback.txt``.

How one notebook is scored, and the module of each step (in course_lib/grading/):

1. Merge (``merging.py``). The reference is the solution notebook ``solutions/<name>.ipynb``.
   Each answer cell (nbgrader metadata ``solution: true``) gets the source of the student's cell
   with the same ``grade_id``; a deleted answer cell gets the exercise's stub. Every other cell,
   the check cells with their hidden tests included, comes from the reference: editing or
   deleting a check changes nothing, and cells the student added are not run.
2. Run (``running.py``). nbval runs the merged notebook top to bottom in a fresh kernel through
   pytest (``--nbval-lax``: only errors count; ``--nbval-cell-timeout``). That kernel is the judge
   (course_lib.grading.judge): the answer cells reach it as text and run only in fresh
   learner-side worker processes, which send back data only. Each cell's outcome comes back
   on a pipe only pytest holds (course_lib.grading.verdicts). A cell that runs past the
   timeout is interrupted and fails; the cells after it still run (the grader's own cells, the
   setup and the start of each submission's sandbox, have a limit of their own, ``--setup-timeout``:
   course_lib.grading.own_cells). If the kernel could not be
   interrupted (or crashed), that cell is replaced by one that raises and the notebook is run
   again, so a hang costs only the cell it hits. Every process a notebook started is stopped
   afterwards. One judge grades up to ``--max-batch`` submissions of an exercise in turn (its
   kernel never runs their code, so it stays clean; ``grader.py`` plans and runs the batches): the
   setup runs once, then each submission's answers and checks, with a cell between two submissions
   that drops the previous one's answer cells and every global its checks bound
   (course_lib.grading.judge.next_submission). That saves a kernel start per submission.
3. Score (``scoring.py``). A check cell (``grade: true``) earns its ``points`` when it ran
   without an error. If one of the grader's own cells failed (the recorder, or the reference's
   cells before its first answer or check: a setup that outlasted --setup-timeout on a busy
   machine, say), no check is scored: the feedback says the grader failed, and grade.py warns
   on stderr.
4. Feedback (``reporting.py``, which also prints the table and writes grades.csv). For each
   check: passed, or the exception's type and message (a CheckFailed explains itself).
   Tracebacks and cell sources are never shown, and any line of a hidden test is removed from
   the messages.

Confinement. Every submission's code runs in a sandbox of its own (course_lib.grading.sandbox:
bubblewrap; its own user, processes, network and files; limits on memory and processes), apart
from the judge. grade.py refuses to grade when this machine cannot make one, and says what to
install. ``--no-sandbox`` grades unconfined (a quick check of one's own notebook): every line of
the table and of grades.csv then says "not sandboxed".
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from ..confine.cgroups import cgroup_roots, cpu_sharing
from ..launcher import available_cpus
from . import on_slurm
from .exercises import stale_files
# Some names below are not used here: the tests and scripts import them from this module.
from .merging import (  # noqa: F401
    NBVAL_MARKER, NEXT_MARKER, NEXT_SUBMISSION_CELL, Reference, batch_split, load_reference, merge, merge_many,
    student_answers)
from .reporting import FEEDBACK_FILE, one_line, print_table, report_progress, warn, write_csv, write_feedback
from .running import CellOutcome, RunResult, kill_running, run_merged  # noqa: F401
from .sandbox import remove_leftovers, sandbox_problem
from .scoring import (NotebookResult, grader_own_cells, grader_setup_failure, not_graded, prepare, score,
                      submission_start_failure)

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------
# Batches: several submissions of one exercise, one judge
# --------------------------------------------------------------------------
def grade_batch(batch: list[tuple[NotebookResult, dict[str, str]]], reference: Reference, options) -> list[NotebookResult]:
    """Grade submissions of one exercise in turn, with one judge (one nbval run)."""
    started = time.monotonic()
    try:
        merged, places, notes = merge_many(reference, [answers for _, answers in batch])
        prefix = work_folder_prefix(batch[0][0].student, reference.name)
        workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=options.work_root))
        try:
            run = run_merged(merged, workdir, options, grader_own_cells(places, reference))
        finally:
            if not options.keep_work:
                shutil.rmtree(workdir, ignore_errors=True)
        failure = grader_setup_failure(run, places[0], reference, options)
        if failure:  # the grader's fault, not the students': say so, and blame no answer for it
            print(f"warning: {reference.name}: {failure}; {len(batch)} submission(s) not graded "
                  "(grade them again; on a busy machine, with a larger --setup-timeout)", file=sys.stderr, flush=True)
        for (result, _), numbers, note in zip(batch, places, notes):
            result.notes = note
            own_failure = failure or submission_start_failure(run, numbers, options)
            if own_failure:  # the grader's fault: this submission is not graded, not given 0
                not_graded(result, f"not graded: {own_failure}; ask your instructor to grade it again")
                continue
            score(result, run, numbers, reference, options)
    except Exception as exc:  # noqa: BLE001 - one submission must never stop the class's grading
        for result, _ in batch:
            not_graded(result, f"the grader failed on this notebook ({type(exc).__name__}: {exc}); ask your instructor")
    finally:
        for result, _ in batch:
            result.seconds = time.monotonic() - started
    return [result for result, _ in batch]


def work_folder_prefix(student: str, notebook: str) -> str:
    """The start of a batch's work folder's name (kept by --keep-work): its first student and its
    notebook, in letters, digits, '.', '_' and '-' only and short, so that no student's name (255
    bytes long, a newline, bytes that are not UTF-8) can stop the batch from starting."""
    def safe(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:40]
    return f"{safe(student)}-{safe(Path(notebook).stem)}-"


def plan_batches(pending: dict[str, list], references: dict[str, Reference], jobs: int,
                 max_batch: int) -> list[tuple[str, list]]:
    """Group each exercise's submissions into judge runs: few enough to save the start-up of a
    kernel per submission, enough to keep every job busy; the largest run first."""
    total = sum(len(items) for items in pending.values())
    tasks = []
    for name, items in pending.items():
        if not items:
            continue
        if max_batch <= 1 or batch_split(references[name]) is None:
            tasks += [(name, [item]) for item in items]
            continue
        count = max(math.ceil(len(items) / max_batch), math.ceil(jobs * len(items) / total))
        count = min(len(items), count)
        tasks += [(name, items[k::count]) for k in range(count)]
    return sorted(tasks, key=lambda task: -len(task[1]))


# --------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------
def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("submissions", type=Path, nargs="?", help="folder with one sub-folder per student")
    parser.add_argument("--solutions", type=Path, default=REPO / "solutions", help="reference notebooks")
    parser.add_argument("--exercises", type=Path, default=REPO / "exercises",
                        help="the exercise notebooks handed out (their names are what is graded)")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help="notebooks graded at once (default: the number of CPU cores; with --slurm, by each "
                             "task, which asks Slurm for as many cores: default 2)")
    parser.add_argument("--max-batch", type=int, default=8,
                        help="submissions of one exercise graded in turn by one judge kernel (default 8; 1: a "
                             "kernel for each)")
    parser.add_argument("--cell-timeout", type=float, default=120,
                        help="seconds one cell may run before it is stopped and fails (default 120)")
    parser.add_argument("--setup-timeout", type=float, default=600,
                        help="seconds one of the grader's own cells (the setup before the first answer, the start of "
                             "each submission's sandbox: none of a student's code) may run; never less than "
                             "--cell-timeout (default 600)")
    parser.add_argument("--csv", type=Path, default=None, help="where to write the table (default SUBMISSIONS/grades.csv)")
    parser.add_argument("--keep-work", type=Path, default=None,
                        help="keep the merged notebooks and pytest logs here (they contain hidden tests)")
    parser.add_argument("--secret-file", type=Path, default=None,
                        help="grade with the hidden cases of the secret in this file (16 characters or more; keep it "
                             "from the students): the same class then gets the same grades again")
    slurm = parser.add_argument_group("a class on a Slurm cluster (course_lib/grading/on_slurm.py)")
    slurm.add_argument("--slurm", action="store_true",
                       help="grade as a Slurm job array: each task grades a share of the students on a node")
    slurm.add_argument("--slurm-tasks", type=int, default=None,
                       help="the number of tasks (default: one per 10 students)")
    slurm.add_argument("--sbatch-option", action="append", default=[], metavar="OPTION",
                       help="an option for sbatch, as one word (--sbatch-option=--partition=teaching); repeatable")
    slurm.add_argument("--slurm-resume", type=Path, default=None, metavar="RUN_FOLDER",
                       help="wait for an interrupted --slurm run, retry its failed tasks once and write its grades")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run the submissions' code unconfined (only to check your own notebook quickly): every "
                             "line of the table and of grades.csv then says 'not sandboxed'")
    return parser


PATH_OPTIONS = ("submissions", "solutions", "exercises", "csv", "keep_work")


def parse_options(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The options, with this run's id and secret; the jobs and batch sizes at least 1; every path
    absolute (the judges run in folders of their own, where a relative path would name another
    place), a link's own path kept (absolute, not resolved: --csv naming a link replaces the link,
    never its target); the CSV in SUBMISSIONS unless --csv says where."""
    options = parser.parse_args(argv)
    if options.slurm_resume is not None:
        if options.submissions is not None or options.slurm:
            parser.error("--slurm-resume takes the run's folder alone: its options are those of the run it resumes")
        return options
    if (options.slurm_tasks is not None or options.sbatch_option) and not options.slurm:
        parser.error("--slurm-tasks and --sbatch-option go with --slurm (grading as a Slurm job array)")
    if options.submissions is None:
        parser.error("name the folder of submissions: course-grade SUBMISSIONS")
    for name in PATH_OPTIONS:
        if getattr(options, name) is not None:
            setattr(options, name, getattr(options, name).absolute())
    options.csv = options.csv or options.submissions / "grades.csv"
    options.run_id = secrets.token_hex(4)
    options.jobs = max(1, options.jobs or (2 if options.slurm else available_cpus()))
    options.slurm_tasks = max(1, options.slurm_tasks) if options.slurm_tasks else None
    options.max_batch = max(1, options.max_batch)
    options.setup_timeout = max(options.setup_timeout, options.cell_timeout)
    options.secret = secret_from(parser, options.secret_file) if options.secret_file else secrets.token_hex(16)
    return options


def secret_from(parser: argparse.ArgumentParser, path: Path) -> str:
    """The secret in ``path`` (this run's hidden cases, and the key that seals the judge's records)."""
    try:
        secret = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        parser.error(f"--secret-file {path} cannot be read ({getattr(exc, 'strerror', None) or exc})")
    if len(secret) < 16 or not secret.isprintable() or " " in secret:
        parser.error(f"--secret-file {path} must hold one word of 16 characters or more (make one with: "
                     "python3 -c 'import secrets; print(secrets.token_hex(16))')")
    return secret


def one_at_a_time_unless_cpu_is_shared(options: argparse.Namespace) -> None:
    """Submissions are graded side by side only where each gets its share of the CPU whatever it runs
    (course_lib.confine.cgroups.cpu_sharing); elsewhere a submission that leaves a hundred processes
    busy would slow the checks of those graded beside it toward their time limits, so one at a time."""
    how, why = cpu_sharing(cgroup_roots() if os.geteuid() == 0 else None)
    if how is None and options.jobs > 1:
        print(f"grade.py: grading one notebook at a time, not {options.jobs}: {why}, so nothing here keeps one "
              "submission's processes from taking the CPU of those graded beside it. To grade side by side, run "
              "the grader as root (each submission then gets a CPU cgroup of its own) or on a machine with the "
              "kernel's autogroups on (sysctl kernel.sched_autogroup_enabled=1) outside any CPU cgroup.", flush=True)
        options.jobs = 1


def csv_destination_problem(path: Path) -> str | None:
    """Why grades.csv could not be written at path, or None: found before grading, not after an hour
    of it. A file of the same name is fine (it is replaced, a link too, never followed)."""
    if os.path.isdir(path) and not os.path.islink(path):
        return (f"{path} is a folder, where the grades would be written: rename that folder, or write the "
                "grades elsewhere with --csv PATH")
    try:  # the one sure test that the folder takes a new file: make one
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".grades-probe-")
    except OSError as exc:
        return f"the grades cannot be written in {path.parent} ({exc.strerror}): choose another place with --csv PATH"
    os.close(fd)
    os.unlink(probe)
    return None


def student_folders(parser: argparse.ArgumentParser, submissions: Path) -> list[str]:
    """Every student's folder name in submissions (hidden ones and those starting with _ left out); a
    link, or an entry that cannot be examined, gets a warning naming it and is not graded."""
    try:
        entries = sorted(submissions.iterdir())
    except OSError as exc:
        parser.error(f"{submissions} cannot be read ({exc.strerror})")
    students = []
    for path in entries:
        if path.name.startswith((".", "_")):
            continue
        try:
            if not path.is_dir():
                continue
        except OSError as exc:
            warn(f"{path} cannot be examined ({exc.strerror}): not graded")
            continue
        if path.is_symlink():  # another student's folder, or anyone's
            warn(f"{path} is a symbolic link, not a student's folder: not graded "
                 "(collect each student's files with `cp -r`, which copies links as links)")
            continue
        students.append(path.name)
    return students


def read_class(parser: argparse.ArgumentParser, options) -> tuple[list[str], dict[str, Reference], list[str]]:
    """The exercises' names, their references and the students; a usage error when one is missing."""
    names = sorted(p.name for p in options.exercises.glob("*.ipynb"))
    if not names:
        parser.error(f"no exercise notebooks in {options.exercises} (run `make exercises`)")
    missing = [n for n in names if not (options.solutions / n).exists()]
    if missing:
        parser.error(f"no solution notebook in {options.solutions} for: {', '.join(missing)}")
    for problem in stale_files(options.solutions, options.exercises, worked_on=False):
        print(f"warning: {problem}", file=sys.stderr)
    try:
        references = {name: load_reference(options.solutions / name) for name in names}
    except ValueError as exc:
        parser.error(str(exc))
    students = student_folders(parser, options.submissions)
    if not students:
        parser.error(f"no student folders in {options.submissions}")
    return names, references, students


def prepare_class(students: list[str], names: list[str], references: dict[str, Reference], options
                  ) -> tuple[dict[tuple[str, str], NotebookResult], dict[str, list]]:
    """The results settled without a run (missing or unreadable notebooks), reported at once, and
    each exercise's submissions left to run."""
    table: dict[tuple[str, str], NotebookResult] = {}
    pending: dict[str, list] = {name: [] for name in names}
    for name in names:
        for student in students:
            result, answers = prepare(student, options.submissions / student / name, references[name])
            if answers is None:
                table[student, name] = result
                report_progress(result, options.no_sandbox)
            else:
                pending[name].append((result, answers))
    return table, pending


def grade_class(students: list[str], names: list[str], references: dict[str, Reference], options
                ) -> dict[tuple[str, str], NotebookResult] | None:
    """Every (student, notebook)'s result, the batches run by options.jobs at once; None if interrupted."""
    table, pending = prepare_class(students, names, references, options)
    tasks = plan_batches(pending, references, options.jobs, options.max_batch)
    pool = ThreadPoolExecutor(max_workers=options.jobs)
    try:
        futures = [pool.submit(grade_batch, batch, references[name], options) for name, batch in tasks]
        for future in as_completed(futures):
            results = future.result()
            for result in results:
                table[result.student, result.name] = result
                report_progress(result, options.no_sandbox, len(results))
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        kill_running()
        # The batches under way end now that their judges are gone, each removing its own work folders.
        pool.shutdown(wait=True)
        remove_leftovers(options.run_id)
        print("interrupted: nothing written", file=sys.stderr)
        return None
    pool.shutdown()
    remove_leftovers(options.run_id)  # the sandboxes of judges that were killed
    return table


def save_grades(path: Path, students: list[str], names: list[str], table: dict, maxima: dict, run_id: str
                ) -> Path | None:
    """Write grades.csv at path; where that fails (something took its place while the class was graded),
    in a new file beside it, so that the grading is not lost. The file written, or None."""
    try:
        write_csv(path, students, names, table, maxima)
        return path
    except OSError as exc:
        why = "is a folder" if isinstance(exc, IsADirectoryError) else f"could not be written ({exc.strerror})"
    fallback = path.with_name(f"{path.stem}-{run_id}{path.suffix}")
    try:
        write_csv(fallback, students, names, table, maxima)
    except OSError:
        print(f"grade.py: {one_line(path)} {why}, and so could {one_line(fallback)}: the table below holds "
              "every grade", file=sys.stderr)
        return None
    print(f"grade.py: {one_line(path)} {why}: the grades are in {one_line(fallback)}", file=sys.stderr)
    return fallback


def main(argv: list[str]) -> int:
    for stream in (sys.stdout, sys.stderr):  # a name that is not UTF-8 is shown escaped, never a crash
        with contextlib.suppress(AttributeError):
            stream.reconfigure(errors="backslashreplace")
    parser = argument_parser()
    options = parse_options(parser, argv)
    if options.slurm_resume is not None:
        return resume_on_slurm(parser, options.slurm_resume.absolute())
    if not options.submissions.is_dir():
        parser.error(f"{options.submissions} is not a folder")
    problem = csv_destination_problem(options.csv)
    if problem:
        parser.error(problem)
    if not options.no_sandbox and not options.slurm:  # on Slurm, each task checks its own node
        problem = sandbox_problem()
        if problem:
            print(f"grade.py: cannot grade: {problem}", file=sys.stderr)
            return 2
        one_at_a_time_unless_cpu_is_shared(options)
    names, references, students = read_class(parser, options)
    maxima = {name: references[name].max_points for name in names}
    if options.keep_work:
        options.keep_work.mkdir(parents=True, exist_ok=True)
        options.work_root = str(options.keep_work)
    else:
        options.work_root = None
    started = time.monotonic()
    if options.slurm:
        options.slurm_tasks = options.slurm_tasks or math.ceil(len(students) / 10)
        tasks = min(options.slurm_tasks, len(students))
        print(f"grading {len(students)} students x {len(names)} notebooks as a Slurm job array of "
              f"{tasks} task{'s' * (tasks != 1)}, {options.jobs} jobs each (cell timeout "
              f"{options.cell_timeout:g} s, setup {options.setup_timeout:g} s, up to {options.max_batch} submissions "
              f"per judge, {'NOT SANDBOXED' if options.no_sandbox else 'each submission in a sandbox'})", flush=True)
        try:
            finished = on_slurm.grade_on_slurm(options, students, names, maxima)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            print(f"grade.py: cannot grade on Slurm: {exc}", file=sys.stderr)
            return 2
        if finished is None:
            return 130
        return write_results(options, students, names, finished[1], maxima, started, finished[0])
    print(f"grading {len(students)} students x {len(names)} notebooks with {options.jobs} jobs "
          f"(cell timeout {options.cell_timeout:g} s, setup {options.setup_timeout:g} s, up to {options.max_batch} submissions per judge, "
          f"{'NOT SANDBOXED' if options.no_sandbox else 'each submission in a sandbox'})", flush=True)
    table = grade_class(students, names, references, options)
    if table is None:
        return 130
    return write_results(options, students, names, table, maxima, started)


def write_results(options, students: list[str], names: list[str], table: dict, maxima: dict, started: float,
                  slurm_run: Path | None = None) -> int:
    """Each student's feedback, grades.csv and the table: the same, from one machine or a Slurm run."""
    write_feedback(options.submissions, students, names, table)
    csv_path = save_grades(options.csv, students, names, table, maxima, options.run_id)
    print()
    print_table(students, names, table, maxima)
    if csv_path != options.csv:
        return 1
    if slurm_run is not None:  # written: its secret and the tasks' results are no longer needed
        on_slurm.remove_run(slurm_run)
    print(f"\nwrote {csv_path} and {FEEDBACK_FILE} in each student's folder "
          f"({time.monotonic() - started:.1f} s)")
    return 0


def resume_on_slurm(parser: argparse.ArgumentParser, run: Path) -> int:
    """--slurm-resume: wait for the run's jobs, retry what failed (once in all), write the grades."""
    if not on_slurm.is_run_folder(run):
        parser.error(f"{run} is not the folder of a --slurm run (SUBMISSIONS/{on_slurm.RUN_PREFIX}<id>, as "
                     "course-grade --slurm printed it)")
    plan = on_slurm.read_plan(run)
    options = on_slurm.plan_options(plan)
    started = time.monotonic()
    print(f"resuming {run}: {len(plan['students'])} students in {len(plan['shares'])} shares", flush=True)
    try:
        _, table = on_slurm.finish_run(run, options.jobs, plan["options"]["sbatch_option"])
    except KeyboardInterrupt:
        on_slurm.say_how_to_resume(run)
        return 130
    return write_results(options, plan["students"], plan["names"], table, plan["maxima"], started, run)


def cli() -> None:
    """The ``course-grade`` console script."""
    sys.exit(main(sys.argv[1:]))
