"""Generate sbatch scripts for a course function and run them on a real Slurm (chapter 04).

``sbatch_script(...)`` writes a batch script in one of the two common forms:

* ``form="torchrun"``: ``srun`` starts one ``torchrun`` agent per node; the agents meet through
  c10d rendezvous on the first node's address and start ``procs_per_node`` workers each;
* ``form="srun"``: ``srun`` starts every worker itself; each maps Slurm's ``SLURM_PROCID``,
  ``SLURM_NTASKS``, ``SLURM_LOCALID`` to ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``.

Both take the head node's address from ``scontrol show node`` (NodeAddr: on clusters whose
node names don't resolve, as on the course's one-machine cluster, the name would not work),
check that it resolves, pick a free port on the head node (never a fixed one), and bound the
start-up (a short rendezvous timeout), so a wrong address fails in seconds instead of hanging.
Nothing in them limits how long the training itself runs: ``time_limit`` adds ``#SBATCH --time``
only when asked (the course's demo jobs ask for a few minutes; a real job asks for what it needs).
Options for real clusters: ``cpus_per_process`` (``--cpus-per-task`` and ``OMP_NUM_THREADS``),
``gpus_per_node`` (one GPU per worker) and ``requeue_before_s`` (preemption: Slurm signals the
batch script that long before the time limit, and the script puts the job back in the queue).
``submit`` submits a script with ``sbatch``, waits for it under a timeout and cancels the job if
the timeout passes. ``cluster_up`` says whether a Slurm controller answers
(``scripts/slurm_cluster.sh up`` starts the course's local one).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .launcher.live import StatusLine
from .torchrun import _collect, print_outputs

FREE_PORT = ("$(python3 -c 'import socket; s = socket.socket(); s.bind((\"\", 0)); "
             "print(s.getsockname()[1])')")


def cluster_up(timeout: float = 5) -> bool:
    """True when ``sinfo`` answers and at least one node is idle or mixed."""
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(state.startswith(("idle", "mix", "alloc")) for state in out.stdout.split())


def why_no_cluster() -> str:
    if shutil.which("sinfo") is None:
        return "Slurm is not installed here (start the course's local cluster as root: make slurm-up)"
    return "no Slurm controller answers (start the course's local cluster as root: make slurm-up)"


def node_addresses(timeout: float = 10) -> dict[str, str]:
    """Each node's NodeAddr, from ``scontrol show node``."""
    out = subprocess.run(["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=timeout,
                         check=True).stdout
    return dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", out))


_HEADER = """#!/bin/bash
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks_per_node}
#SBATCH --output={output}
{options}set -euo pipefail

# The head node is the first of the job's nodes. Take its address from Slurm: a node's name
# need not resolve (emulated nodes, some clusters), its NodeAddr does.
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
HEAD_ADDR=$(scontrol show node "$HEAD_NODE" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
getent hosts "$HEAD_ADDR" >/dev/null || {{ echo "cannot resolve the head node's address '$HEAD_ADDR'" >&2; exit 1; }}
# This batch script runs on the head node: ask it for a free port (a fixed port collides).
PORT={free_port}
echo "job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES nodes, head $HEAD_NODE at $HEAD_ADDR:$PORT"
"""

_CPUS = """# srun does not pass the job's --cpus-per-task on to its tasks (Slurm 22.05 and later): say it again.
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK OMP_NUM_THREADS={threads}
"""

_REQUEUE = """# Preemption: {seconds} s before the time limit (or when the scheduler preempts the job) Slurm
# sends SIGUSR1 to this batch script (--signal=B:USR1@{seconds}). It puts the job back in the
# queue; the new run resumes from the training's last snapshot (chapter 04, section 4).
trap 'echo "SIGUSR1: requeueing job $SLURM_JOB_ID"; scontrol requeue "$SLURM_JOB_ID"' USR1
"""

_TORCHRUN_BODY = """
# One torchrun agent per node; the agents meet at the head's address (c10d rendezvous) and
# each starts {procs} workers. --rdzv-id keeps two jobs on one head apart; join_timeout bounds
# the wait for a node that never arrives (not the training).
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    {python} -m torch.distributed.run \\
    --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node={procs} \\
    --rdzv-backend=c10d --rdzv-endpoint="$HEAD_ADDR:$PORT" --rdzv-id="$SLURM_JOB_ID" \\
    --rdzv-conf=join_timeout={join_timeout} \\
    {script}{wait}
"""

_SRUN_BODY = """
# srun starts every worker; each maps its Slurm task ids to the variables torch reads.
export MASTER_ADDR="$HEAD_ADDR" MASTER_PORT="$PORT"
srun --kill-on-bad-exit=1 bash -c '
    export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS
    export LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE GROUP_RANK=$SLURM_NODEID
    exec {python} {script}'{wait}
"""

# bash runs a trap only between commands: with one, srun goes to the background and the script waits
# for it (wait returns when SIGUSR1 arrives, the trap requeues the job).
_WAIT = " &\nwait $!"


def sbatch_script(script: str | Path, nodes: int = 2, procs_per_node: int = 2, *, form: str = "torchrun",
                  gpus_per_node: int = 0, cpus_per_process: int | None = None, time_limit: str | None = None,
                  requeue_before_s: int | None = None, job_name: str = "course", output: str = "slurm-%j.out",
                  join_timeout: int = 60, python: str | None = None) -> str:
    """The text of an sbatch script that runs ``script`` on ``nodes`` x ``procs_per_node`` processes.

    ``gpus_per_node``: one GPU per worker. The torchrun form asks for the node's GPUs (``--gres``) and
    each worker takes ``cuda:LOCAL_RANK``; the srun form asks for one GPU per task
    (``--gpus-per-task=1``), which the task sees alone, as ``cuda:0``.
    ``cpus_per_process``: cores for each worker (``--cpus-per-task``; the torchrun form's one task
    per node gets ``procs_per_node`` times as many), also its ``OMP_NUM_THREADS``.
    ``time_limit``: ``#SBATCH --time`` ("HH:MM:SS"); None leaves the partition's default.
    ``requeue_before_s``: requeue the job when Slurm signals it, that many seconds before the time limit.
    """
    if form not in ("torchrun", "srun"):
        raise ValueError(f"form must be 'torchrun' or 'srun', not {form!r}")
    if nodes < 1 or procs_per_node < 1:
        raise ValueError("nodes and procs_per_node must be at least 1")
    python = python or sys.executable
    tasks_per_node = 1 if form == "torchrun" else procs_per_node
    options = []
    if time_limit is not None:
        options.append(f"--time={time_limit}")
    if cpus_per_process:
        options.append(f"--cpus-per-task={cpus_per_process * procs_per_node // tasks_per_node}")
    if gpus_per_node:
        options.append(f"--gres=gpu:{gpus_per_node}" if form == "torchrun" else "--gpus-per-task=1")
    if requeue_before_s:
        options += ["--requeue", f"--signal=B:USR1@{requeue_before_s}"]
    header = _HEADER.format(
        job_name=job_name, nodes=nodes, tasks_per_node=tasks_per_node, output=output, free_port=FREE_PORT,
        options="".join(f"#SBATCH {option}\n" for option in options))
    if cpus_per_process:
        header += _CPUS.format(threads=cpus_per_process)
    if requeue_before_s:
        header += _REQUEUE.format(seconds=requeue_before_s)
    body = (_TORCHRUN_BODY if form == "torchrun" else _SRUN_BODY).format(
        procs=procs_per_node, python=shlex.quote(python), script=shlex.quote(str(script)),
        join_timeout=join_timeout, wait=_WAIT if requeue_before_s else "")
    return header + body


@dataclass
class SlurmJob:
    job_id: str
    exit_code: int
    state: str
    log: str
    results: list = field(default_factory=list)
    outputs: dict = field(default_factory=dict)


def _job_info(job_id: str) -> tuple[str, int]:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=10).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\d+):(\d+)", out)
    exit_code = (int(code.group(1)) or -int(code.group(2))) if code else -1
    return (state.group(1) if state else "UNKNOWN"), exit_code


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE", "UNKNOWN")


def submit(batch_text: str, *, timeout: float = 180, show_output: bool = True, workdir: str | Path | None = None,
           env: dict[str, str] | None = None) -> SlurmJob:
    """Submit with ``sbatch``, wait for the job; return its id, exit code, state, log and ranks' results.

    The job's workers save their results and output through course_lib's torchrun entry point;
    they are printed in rank order. After ``timeout`` seconds (or an interrupt) the job is cancelled.
    """
    own_workdir = not workdir  # made here, so removed here
    workdir = Path(workdir or tempfile.mkdtemp(prefix="slurm-job-"))
    collect = Path(tempfile.mkdtemp(prefix="slurm-out-"))
    private_tmp = collect / "tmp"  # the job's TMPDIR (sbatch passes the environment on): torchrun's log folders
    private_tmp.mkdir()
    try:
        job_id, code, state, log, results, outputs = _run_job(batch_text, workdir, collect, timeout, {
            **os.environ, "TMPDIR": str(private_tmp), **(env or {}), "COURSE_TORCHRUN_OUTPUT": str(collect)})
    finally:  # read by now, or the job failed: nothing of it stays on the machine
        shutil.rmtree(collect, ignore_errors=True)
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    if show_output:
        print_outputs(outputs)
    return SlurmJob(job_id, code, state, log, results, outputs)


def _run_job(batch_text, workdir: Path, collect: Path, timeout: float, run_env: dict):
    """sbatch the job from ``workdir``, wait for it (cancel it when late or interrupted), read what it left."""
    batch = workdir / "job.sbatch"
    batch.write_text(batch_text)
    submitted = subprocess.run(["sbatch", "--parsable", str(batch)], cwd=workdir, env=run_env,
                               capture_output=True, text=True, timeout=30)
    if submitted.returncode != 0:
        raise RuntimeError(f"sbatch refused the job: {submitted.stderr.strip()}")
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    try:
        with StatusLine(f"Slurm job {job_id}") as status:
            while True:  # sbatch --wait polls with a growing interval; ask every half second instead
                state, code = _job_info(job_id)
                if state in FINISHED:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"job {job_id} did not finish within {timeout} s (state {state}); cancelled it")
                status.show(state.lower())
                time.sleep(0.5)
    except BaseException:
        subprocess.run(["scancel", job_id], timeout=10)
        raise
    logs = sorted(workdir.glob("slurm-*.out"))
    log = logs[0].read_text(errors="replace") if logs else ""
    results, outputs = _collect(collect, 0)
    return job_id, code, state, log, results, outputs
