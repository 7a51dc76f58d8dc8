"""course_lib.slurm: the generated sbatch scripts, and jobs run on the local Slurm cluster.

The job tests need a Slurm controller (``make slurm-up`` as root starts the course's one-machine
cluster); without one they skip and say why, unless ``COURSE_REQUIRE_SLURM=1`` (CI) makes that a
failure.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course_lib import slurm
from course_lib.torchrun_script import write_torchrun_script
from optional import skip_or_fail

REPO = Path(__file__).resolve().parents[1]


def where_am_i():
    ones = torch.ones(1)
    dist.all_reduce(ones)
    return {name: int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")} | {
        "sum": ones.item(), "node": os.environ.get("SLURMD_NODENAME")}


@pytest.fixture
def cluster():
    if not slurm.cluster_up():
        skip_or_fail(slurm.why_no_cluster(), "COURSE_REQUIRE_SLURM", "the Slurm tests")


@pytest.mark.parametrize("form", ["torchrun", "srun"])
def test_generated_scripts_bound_the_start_up_and_use_no_fixed_port(form, tmp_path):
    text = slurm.sbatch_script(tmp_path / "train.py", nodes=3, procs_per_node=4, form=form)
    assert "#SBATCH --nodes=3" in text
    assert f"#SBATCH --ntasks-per-node={1 if form == 'torchrun' else 4}" in text
    assert "29500" not in text and "29400" not in text and "MASTER_PORT=1" not in text
    assert "NodeAddr" in text and "getent hosts" in text
    if form == "torchrun":
        assert "--rdzv-backend=c10d" in text and "--nproc-per-node=4" in text and "join_timeout=" in text
    else:
        assert "RANK=$SLURM_PROCID" in text and "WORLD_SIZE=$SLURM_NTASKS" in text and "LOCAL_RANK=$SLURM_LOCALID" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=10)  # valid shell


@pytest.mark.parametrize("form", ["torchrun", "srun"])
def test_nothing_limits_the_training_unless_asked(form, tmp_path):
    text = slurm.sbatch_script(tmp_path / "train.py", form=form)
    assert not re.search(r"\btimeout \d", text) and "--time" not in text and "trap" not in text
    assert "#SBATCH --time=00:05:00" in slurm.sbatch_script(tmp_path / "train.py", form=form, time_limit="00:05:00")


@pytest.mark.parametrize(("form", "gpus", "cpus"), [("torchrun", "--gres=gpu:4", 8), ("srun", "--gpus-per-task=1", 2)])
def test_gpus_and_cpus_per_worker(form, gpus, cpus, tmp_path):
    text = slurm.sbatch_script(tmp_path / "train.py", nodes=2, procs_per_node=4, form=form, gpus_per_node=4,
                               cpus_per_process=2)
    assert f"#SBATCH {gpus}\n" in text and f"#SBATCH --cpus-per-task={cpus}\n" in text
    assert "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK OMP_NUM_THREADS=2" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=10)


FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "show hostnames") echo n1 ;;
  "show node") echo "NodeName=n1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=n1" ;;
  requeue*) echo "requeue $2" >> "$CALLS" ;;
esac
"""
FAKE_SRUN = "#!/bin/bash\necho started >> \"$CALLS\"\nexec sleep 60\n"


@pytest.mark.parametrize("form", ["torchrun", "srun"])
def test_the_preemption_signal_requeues_the_job(form, tmp_path):
    """The batch script run by bash, with stand-ins for scontrol and srun: SIGUSR1 requeues it at once."""
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    script = slurm.sbatch_script(tmp_path / "train.py", form=form, time_limit="01:00:00", requeue_before_s=120)
    assert "#SBATCH --requeue\n" in script and "#SBATCH --signal=B:USR1@120\n" in script
    (tmp_path / "job.sbatch").write_text(script)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "CALLS": str(calls), "SLURM_JOB_ID": "42",
           "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}
    log = open(tmp_path / "slurm-42.out", "w")
    job = subprocess.Popen(["bash", str(tmp_path / "job.sbatch")], env=env, stdout=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (calls.exists() and "started" in calls.read_text()):
            assert time.monotonic() < deadline, "srun never started"
            time.sleep(0.05)
        started = time.monotonic()
        job.send_signal(signal.SIGUSR1)  # what Slurm sends 120 s before the time limit
        job.wait(timeout=10)  # the requeued job's steps are Slurm's to stop (here: the finally below)
        assert time.monotonic() - started < 5, "the script waited for srun instead of handling the signal"
        assert calls.read_text().splitlines() == ["started", "requeue 42"]
        assert "SIGUSR1: requeueing job 42" in (tmp_path / "slurm-42.out").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # the stand-in srun's sleep, whatever happened
        job.wait(timeout=10)
        log.close()


def test_bad_arguments_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="form must be"):
        slurm.sbatch_script(tmp_path / "x.py", form="mpirun")
    with pytest.raises(ValueError, match="at least 1"):
        slurm.sbatch_script(tmp_path / "x.py", nodes=0)


@pytest.mark.parametrize("form", ["torchrun", "srun"])
def test_a_two_node_job_forms_one_world(form, cluster, tmp_path, monkeypatch):
    script = write_torchrun_script(where_am_i, tmp_path / "where_am_i.py")
    temporary = tmp_path / "tmp"  # where submit makes its folders: empty again once it returns
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    started = time.monotonic()
    job = slurm.submit(slurm.sbatch_script(script, 2, 2, form=form, join_timeout=30, time_limit="00:05:00"), timeout=240,
                       show_output=False, workdir=tmp_path)
    assert list(temporary.iterdir()) == [], "the job's output folder and torchrun's log folders are removed"
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job.log
    assert [(r["RANK"], r["GROUP_RANK"], r["LOCAL_RANK"], r["WORLD_SIZE"], r["sum"]) for r in job.results] == [
        (0, 0, 0, 4, 4.0), (1, 0, 1, 4, 4.0), (2, 1, 0, 4, 4.0), (3, 1, 1, 4, 4.0)]
    assert len({r["node"] for r in job.results}) == 2, "the ranks should run on two Slurm nodes"
    print(f"{form} job: {time.monotonic() - started:.1f} s")


def test_an_address_that_does_not_resolve_fails_fast(cluster, tmp_path):
    script = write_torchrun_script(where_am_i, tmp_path / "where_am_i.py")
    text = slurm.sbatch_script(script, 2, 1, form="srun", time_limit="00:05:00")
    text = re.sub(r"^HEAD_ADDR=.*$", "HEAD_ADDR=n1.invalid", text, flags=re.MULTILINE)
    started = time.monotonic()
    job = slurm.submit(text, timeout=120, show_output=False, workdir=tmp_path)
    assert job.state == "FAILED" and job.exit_code != 0
    assert "cannot resolve the head node's address 'n1.invalid'" in job.log
    assert time.monotonic() - started < 60


def test_the_cluster_script_is_idempotent(cluster):
    if os.geteuid() != 0:
        pytest.skip("scripts/slurm_cluster.sh needs root")
    done = subprocess.run([str(REPO / "scripts" / "slurm_cluster.sh"), "up"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "already up" in done.stdout, done.stdout + done.stderr


def waits_unless_requeued():
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))  # Slurm counts the job's requeues
    if restarts == 0:
        time.sleep(150)  # the first run is preempted long before this ends
    return restarts


def test_a_preempted_job_is_requeued_and_runs_again(cluster, tmp_path):
    """SIGUSR1 to the batch script, as --signal=B:USR1@N sends it: the job goes back to the queue and reruns."""
    script = write_torchrun_script(waits_unless_requeued, tmp_path / "waits.py")
    name = f"course-requeue-{os.getpid()}"
    text = slurm.sbatch_script(script, 1, 1, form="srun", time_limit="00:05:00", requeue_before_s=60, job_name=name)
    signalled = []

    def preempt_once_running():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not signalled:
            logs = list(tmp_path.glob("slurm-*.out"))
            if logs and "head" in logs[0].read_text():  # the batch script is past its header: the trap is set
                time.sleep(2)
                job_id = logs[0].name.split("-")[1].split(".")[0]
                subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], timeout=20, check=True)
                signalled.append(job_id)
                # Slurm holds a requeued job for two minutes; this test lifts the hold once the job is back in
                # the queue and its node has finished cleaning up after the first run (starting earlier fails it)
                while time.monotonic() < deadline and (slurm._job_info(job_id)[0] != "PENDING" or any(
                        state.startswith("comp") for state in subprocess.run(
                            ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=10).stdout.split())):
                    time.sleep(0.5)
                time.sleep(2)
                subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], timeout=20)
            time.sleep(0.2)

    import threading

    preempter = threading.Thread(target=preempt_once_running, daemon=True)
    preempter.start()
    job = slurm.submit(text, timeout=240, show_output=False, workdir=tmp_path)
    preempter.join(timeout=5)
    assert signalled == [job.job_id], "the job was never signalled"
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job.log
    assert job.results == [1], "the rerun should see SLURM_RESTART_COUNT=1"
    out = subprocess.run(["scontrol", "show", "job", job.job_id], capture_output=True, text=True, timeout=10).stdout
    assert "Restarts=1" in out, out
