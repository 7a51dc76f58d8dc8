"""The grading sandbox (course_lib.grading.sandbox), attacked the way a submission would.

tests/sandbox_routes.py becomes a judge, as grade.py's kernel does, and runs each hostile route
on the learner side in a sandbox; these tests read what happened. Skipped only where this
machine cannot make a sandbox (then grade.py refuses to grade, which test_grading.py checks).
"""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.confine.cgroups import cgroup_roots, cpu_sharing
from course_lib.grading.sandbox import sandbox_problem

REPO = Path(__file__).resolve().parents[1]
PROBLEM = sandbox_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"no sandbox here: {PROBLEM}")


@pytest.fixture(scope="module", params=["as run", "as an ordinary user"])
def routes(request):
    """Every route, by a judge running as these tests do (in CI: root, with cgroups) and, when that is
    root, again as an ordinary user with 1,100 threads of its own running (tests/ordinary_user.py):
    no cgroups there, the process limit is RLIMIT_NPROC and memory the judge's watchdog."""
    command = [sys.executable, str(REPO / "tests" / "sandbox_routes.py"), "an-argument-of-the-judges"]
    if request.param == "as an ordinary user":
        if os.geteuid() != 0:
            pytest.skip("these tests already run as an ordinary user (the 'as run' case)")
        command = [sys.executable, str(REPO / "tests" / "ordinary_user.py"), *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=REPO)
    last = [line for line in run.stdout.splitlines() if line.startswith("ALL ")]
    assert run.returncode == 0 and last, run.stdout[-5000:] + run.stderr[-5000:]
    found = json.loads(last[-1][4:])
    found["judge_stderr"] = run.stderr  # complete: every process holding the judge's stderr has ended
    as_root = os.geteuid() == 0 and request.param == "as run"
    assert found["judge"] == {"euid": 0 if as_root else found["judge"]["euid"], "cgroups": as_root}, found["judge"]
    assert as_root or found["judge"]["euid"] != 0
    return found


def test_the_learner_side_sees_nothing_of_the_host(routes):
    seen = routes["looks_around"]["value"]
    assert seen["uid"] == 65534
    assert seen["pids_seen"] == [1, 2, max(seen["pids_seen"])]  # bwrap's init, the launch server, itself
    assert seen["solutions"].startswith("refused") and seen["classmate"].startswith("refused")
    assert seen["host_port"].startswith("refused")  # the judge kernel's ports: another network
    assert seen["environment_token"] is None  # the grader's environment stays with the grader
    assert seen["authkey"] != routes["judges_own"]["authkey"]  # multiprocessing's key: each process its own
    # The judge's program, not its arguments (a kernel's name its connection file):
    assert seen["argv"] == routes["judges_own"]["argv"][:1] != routes["judges_own"]["argv"]
    assert seen["tmp"] != "refused" and not any(name.startswith("classmate") for name in seen["tmp"])


def test_a_detached_daemon_dies_with_the_submissions_sandbox(routes):
    assert routes["leaves_a_daemon"]["ok"]
    assert routes["daemon_gone"]["alive_after"] == []


def test_a_submission_cannot_take_more_than_its_share_of_the_cpu(routes):
    """setsid is refused in every rank (a session is an autogroup: one more share of the CPU each); what asks
    subprocess for a new session (torchrun's agent) gets a process group in the same session instead; and after
    twenty busy processes tried, the sandbox's processes are all in one autogroup and, where the judge is root
    with a CPU controller, in its CPU cgroup (scripts/bench_cpu_share.py measures the effect on a neighbour)."""
    assert routes["starts_sessions"]["ok"], routes["starts_sessions"]
    found = routes["starts_sessions"]["value"]
    assert found["setsid_errno"] == errno.EPERM
    assert found["popen"] == {"own_group": True, "same_session": True}
    assert found["agents_popen"] == ["True", "True"], found
    share = routes["cpu_share"]
    assert share["processes"] >= 20 + 2 and len(share["autogroups"]) == 1, share
    how, _ = cpu_sharing(cgroup_roots() if routes["judge"]["euid"] == 0 else None)
    assert share["cpu_cgroup"] == share["holds_all"] == (how == "cgroup"), (share, how)


def test_a_fork_bomb_is_stopped_by_the_process_limit(routes):
    assert routes["fork_bomb"]["ok"], routes["fork_bomb"]
    bomb = routes["fork_bomb"]["value"]
    assert bomb["stopped_by"] is not None and bomb["children"] < 1100


def test_a_huge_result_is_refused_before_the_judge_reads_it(routes):
    assert routes["huge_result"]["message"].startswith("rank 0 failed with ResultTooLarge")


def test_a_view_claiming_more_than_a_check_accepts_is_refused_as_it_arrives(routes):
    assert routes["expanded_result"]["message"].startswith("rank 0 failed with ResultTooLarge"), routes["expanded_result"]
    assert "claim 65536 MiB" in routes["expanded_result"]["message"]


def test_bytes_written_to_dev_null_are_not_bytes_sent(routes):
    assert routes["dev_null"]["error"] == "MeasurementRefused", routes["dev_null"]
    assert "/dev/null" in routes["dev_null"]["message"]


def test_memory_held_by_a_helper_process_counts(routes):
    results, measured = routes["helper_memory"]["value"]
    honest = routes["honest_all_reduce"]["value"][1]
    assert measured[0]["peak_rss_bytes"] > honest[0]["peak_rss_bytes"] + (400 << 20) * 0.9


def test_memory_kept_in_files_counts(routes):
    """A file in the rank's folder (the sandbox's /tmp is a tmpfs) and an unmapped memfd hold memory that no
    process's resident size shows; a rule on a rank's memory counts them."""
    results, measured = routes["memory_in_files"]["value"]
    honest = routes["honest_all_reduce"]["value"][1]
    assert measured[0]["peak_rss_bytes"] > honest[0]["peak_rss_bytes"] + (400 << 20) * 0.9


def test_an_honest_all_reduce_is_measured_without_its_output(routes):
    results, measured = routes["honest_all_reduce"]["value"]
    assert results == [4.0] * 4
    ring = 2 * 3 / 4 * (1 << 18) * 4  # bytes each rank sends in gloo's ring all-reduce
    for m in measured:
        assert abs(m["sent_bytes"] - ring) < 8192 + 0.05 * ring, measured


def test_a_rank_that_exits_before_it_is_measured_fails(routes):
    assert "NotMeasured" in routes["exits_early"]["message"]


def test_the_bytes_between_ranks_are_read_from_outside_per_pair(routes):
    """A built-in all-gather hidden from the rank's own log still leaves its ring behind: the judge
    reads per pair of ranks what arrived (the kernel's socket table), and the broadcasts the exercise
    asks for leave another matrix, the same one the judge's own run of them leaves."""
    tensor = 4 << 16

    def in_tensors(measured):
        return [[round(sent / tensor, 1) for sent in m["sent_to"]] for m in measured]

    broadcasts = in_tensors(routes["broadcast_flows"]["value"][1])
    hidden = in_tensors(routes["hidden_all_gather_flows"]["value"][1])
    reference = [[round(sent / tensor, 1) for sent in row] for row in routes["reference_broadcast_flows"]["value"]]
    for matrix in (broadcasts, hidden, reference):
        assert sum(sum(row) for row in matrix) == 12.0  # every rank receives the other 3 tensors either way
    assert broadcasts == reference
    # gloo's all-gather is a ring: every rank sends all 3 tensors to one neighbour, nothing to the others.
    assert sorted(sorted(row) for row in hidden) == [[0.0, 0.0, 0.0, 3.0]] * 4
    assert hidden != broadcasts
    assert all(m["sent_to_others"] == 0 for m in routes["hidden_all_gather_flows"]["value"][1])


def test_each_rank_holds_only_its_own_input(routes):
    assert routes["frames"]["value"] == [[4.0], [40.0], [400.0]]


def test_nothing_the_learner_side_writes_reaches_the_judges_resource_tracker(routes):
    """Python's multiprocessing gives each process it starts the pipe to its starter's resource tracker; the
    ranks get a pipe that leads nowhere instead (a line written to the judge's would make it print here)."""
    assert routes["resource_tracker"]["ok"], routes["resource_tracker"]
    assert "a-line-from-the-learner-side" not in routes["judge_stderr"], routes["resource_tracker"]


def test_a_sandbox_whose_launch_server_died_starts_nothing_outside(routes):
    """Python's forkserver starts a new server when the last one exited, with the plain interpreter: outside
    the sandbox, as the judge. The sandbox's server is started once; after it, a launch says the sandbox ended."""
    died = routes["after_the_server_died"]
    assert routes["started_outside"] == [], died
    assert not died["ok"] and "the learner side's sandbox has ended" in died["message"], died


ESCAPE = REPO / "tests" / "submissions" / "01_collectives" / "wrong_escape_the_sandbox.ipynb"


def test_the_escape_routes_are_real_they_score_without_the_sandbox(tmp_path):
    # tests/test_chapter_exercises.py grades this submission in the sandbox, where it must earn 0.
    # Unconfined, the same notebook copies the solution from solutions/ and earns points: the routes
    # it tries are real, and only the sandbox stops them.
    (tmp_path / "class" / "eve").mkdir(parents=True)
    (tmp_path / "exercises").mkdir()
    (tmp_path / "class" / "eve" / "01_collectives.ipynb").write_bytes(ESCAPE.read_bytes())
    (tmp_path / "exercises" / "01_collectives.ipynb").write_bytes((REPO / "exercises" / "01_collectives.ipynb").read_bytes())
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "grade.py"), str(tmp_path / "class"), "--no-sandbox",
                          "--exercises", str(tmp_path / "exercises"), "--jobs", "1"],
                         capture_output=True, text=True, timeout=400, cwd=REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    feedback = (tmp_path / "class" / "eve" / "feedback.txt").read_text()
    assert "[3/3] all_reduce from send/recv" in feedback, feedback  # copied from solutions/


def test_a_sandbox_that_cannot_be_made_says_what_bwrap_said(tmp_path, monkeypatch):
    # E.g. an ordinary user at their limit on processes: bwrap cannot make its namespaces. The
    # judge must say so (and end the sandbox), not fail later on a launch server that is not there.
    from course_lib import launcher
    from course_lib.grading import sandbox as sandbox_module

    failing = tmp_path / "bwrap"
    failing.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Resource temporarily unavailable' >&2\n"
                       "exit 1\n")
    failing.chmod(0o755)
    box = sandbox_module.Sandbox()
    monkeypatch.setattr(sandbox_module, "_bwrap", lambda: str(failing))
    try:
        with pytest.raises(sandbox_module.SandboxUnavailable, match="could not be made; it said: bwrap: Creating new "
                                                                     "namespace failed: Resource temporarily"):
            launcher._sandbox_context(box)
        with pytest.raises(launcher.LaunchError, match="sandbox has ended: the sandbox could not be made"):
            launcher._sandbox_context(box)
    finally:
        box.close()


SHORT_LIVED_THREAD = """
import os, threading
os.environ["COURSE_GRADING"] = "1"
from course_lib.grading import judge
judge.become_judge()
learner = judge.Learner(answers=(), setup="import os")
first = {}
thread = threading.Thread(target=lambda: first.update(pid=learner.call(os.getpid)))
thread.start()
thread.join()
print("PIDS", first["pid"], learner.call(os.getpid))
learner.end_sandbox()
"""


def test_a_sandbox_started_from_a_thread_outlives_that_thread():
    # bwrap's --die-with-parent follows the thread that forked it: a sandbox started by a launch from a
    # short-lived thread used to die with it, and the next launch failed with "no process N in the sandbox".
    run = subprocess.run([sys.executable, "-c", SHORT_LIVED_THREAD], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    first, second = map(int, run.stdout.split("PIDS")[1].split())
    assert first > 2 and second > first  # both ranks inside the same, living sandbox (pids 1, 2: bwrap, the server)


def test_the_ranks_of_a_launch_reach_each_other_only_over_the_network(routes):
    """Each rank is kept apart in a Landlock domain of its own (course_lib.confine.apart): a secret that
    rank 1 leaves in a file, a shared-memory file, its working folder or an abstract Unix socket does not
    reach rank 0, nor does rank 1's memory or folders through /proc; only the folder the check shares.
    No rank reaches the launch server's socket (whose children would run outside the rank's domain), sends a
    UDP or netlink datagram (which the per-pair TCP counts would not see), or leaves a key in the kernel's
    keyrings (which would outlive the submission)."""
    ranks = routes["ranks_apart"]["value"]
    wrote, found = ranks[1]["wrote"], ranks[0]["found"]
    assert wrote == {"tmp": "refused: Permission denied", "dev_shm": "refused: Permission denied",
                     "working_dir": "written", "scratch": "refused: Permission denied", "shared": "written",
                     "abstract_socket": "refused: Operation not permitted", "netlink": "refused: Operation not permitted",
                     "keyring": "refused: Operation not permitted"}, wrote
    assert found.pop("shared") == "read"  # what the check shares with every rank (a checkpoint folder)
    refused = {name: said for name, said in found.items() if not said.startswith("refused")}
    assert not refused and len(found) == 14, found
    assert found["netlink"] == found["keyring"] == "refused: Operation not permitted", found
    assert ranks[0]["cwd"] != ranks[1]["cwd"]  # a working folder of its own


def test_no_landlock_means_no_sandbox_and_says_how_to_get_one(monkeypatch):
    # Without Landlock the ranks of a launch could share files and read each other's memory: grading
    # refuses (unless --no-sandbox, which marks every grade) and says what the kernel lacks.
    from course_lib.confine import apart
    from course_lib.grading import sandbox as sandbox_module

    monkeypatch.setattr(apart, "landlock_abi", lambda: 0)
    problem = sandbox_module.sandbox_problem()
    assert problem is not None and "Landlock" in problem and "lsm=" in problem and "5.13" in problem, problem


def test_the_socket_filter_allows_only_what_torch_and_gloo_use():
    # The seccomp program itself, in a child process of its own (a filter cannot be removed): an allowlist.
    # Each refused kind is one a rank could otherwise make here (MPTCP, netlink's USERSOCK and vsock were,
    # on this course's CI machine), and a keyring outlives the processes that used it.
    code = """
import ctypes, socket
from course_lib.confine.apart import deny_side_sockets
print(deny_side_sockets())
kinds = [(socket.AF_INET, socket.SOCK_STREAM, 0), (socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC, 6),
         (socket.AF_NETLINK, socket.SOCK_RAW, 0),                             # made: the routing tables
         (socket.AF_UNIX, socket.SOCK_STREAM, 0), (socket.AF_UNIX, socket.SOCK_DGRAM, 0),
         (socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0), (socket.AF_INET6, socket.SOCK_DGRAM, 0),
         (socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),               # ping sockets
         (socket.AF_INET, socket.SOCK_STREAM, 262), (socket.AF_INET, socket.SOCK_STREAM, 132),  # MPTCP, SCTP
         (socket.AF_INET, socket.SOCK_RAW, 6), (socket.AF_INET, socket.SOCK_SEQPACKET, 0),
         (socket.AF_NETLINK, socket.SOCK_RAW, 2), (socket.AF_NETLINK, socket.SOCK_DGRAM, 16),  # USERSOCK, GENERIC
         (40, socket.SOCK_STREAM, 0), (30, socket.SOCK_RDM, 0), (17, socket.SOCK_RAW, 0)]  # vsock, TIPC, packet
for family, kind, protocol in kinds:
    try:
        socket.socket(family, kind, protocol).close()
        print("made")
    except PermissionError:
        print("refused")
print(len(socket.if_nameindex()) > 0)  # the launcher finds the loopback interface this way
a, b = socket.socketpair()  # a connected pair reaches no other process: allowed
print("pair")
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(0, 4096, 0o1600), ctypes.get_errno())  # IPC_PRIVATE: refused with EPERM
add_key = {"x86_64": 248, "aarch64": 217}[__import__("platform").machine()]
print("key", libc.syscall(add_key, b"user", b"course-key", b"a secret", 8, -4), ctypes.get_errno())  # user keyring
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "made", "made", "made"] + ["refused"] * 14 + [
        "True", "pair", "shm", "-1", "1", "key", "-1", "1"], run.stdout


def test_a_sandbox_emptied_for_the_next_submission_holds_nothing_of_the_last(routes):
    """One judge grades several submissions in turn, in one sandbox emptied between two: the launch server
    (which imports torch) is kept; every other process is killed and every writable folder emptied."""
    emptied = routes["emptied"]
    assert emptied["reused"] and emptied["same_sandbox"], emptied
    assert emptied["processes_before"] > 3 and emptied["processes_after"] == 3, emptied  # bwrap, init, the server
    assert emptied["left_in_writable_folders"] == [], emptied
    found = routes["after_emptying"]["value"]
    assert all(said.startswith("refused: No such file") for said in found.values()), found


def test_memory_held_in_socket_queues_nobody_reads_counts(routes):
    """Datagrams queued on Unix socket pairs and netlink replies queued on routing sockets are kernel memory no
    process's resident size (nor, for these, a cgroup) shows: the judge reads every socket's memory from
    outside (sock_diag, course_lib.confine.socket_memory) and ends the sandbox past its limit (here 32 MiB)."""
    queues, watch = routes["socket_queues"], routes["socket_queues_watch"]
    assert not queues["ok"], queues
    assert "its sockets held" in (watch["ended_because"] or ""), watch
    assert watch["most_socket_bytes"] > 32 << 20 and watch["errors"] == 0, watch


def test_what_the_learner_side_keeps_is_held_to_the_limits_in_memory_not_on_the_hosts_disk(routes):
    """/tmp (every rank's own folder) is a tmpfs of the sandbox's own: a submission cannot fill the host's
    disk (here with limits of 64 MiB and 2,000 files). The route many_files runs right after /tmp was filled:
    its rank's folder is still there, not where tempfile.gettempdir() would fall back to with /tmp full (the
    working directory, the scratch folder on the host's disk, which once took its 20,000 files in CI)."""
    filled = routes["fills_its_folder"]["value"]
    assert filled["error"] == "No space left on device" and 56 << 20 <= filled["written"] <= 64 << 20, filled
    assert filled["folder"].startswith("/tmp/rank-"), filled
    assert routes["on_the_hosts_disk"] < 1 << 20, routes["on_the_hosts_disk"]
    many, watch = routes["many_files"], routes["many_files_watch"]
    assert not many["ok"] and "more than the 2000 files" in many["message"], (many, watch)
    assert watch["most_files"] > 2000 and watch["errors"] == 0, watch


def test_the_watchdog_ends_a_sandbox_over_its_file_limit_and_outlives_a_failed_look(monkeypatch):
    """The watchdog's rule, on a sandbox whose folders' counts are given: a look that raises is recorded and
    the next one runs; the first count over the limit ends the sandbox (its first process killed) and says why."""
    from course_lib.grading.sandbox import Sandbox

    box = Sandbox()
    stand_in = subprocess.Popen(["sleep", "60"])  # stands for bwrap: end() kills it
    looks = iter([OSError("a look that failed"), {"/tmp": (1 << 20, 1999)}, {"/tmp": (1 << 20, 2001)}])

    def usage():
        look = next(looks)
        if isinstance(look, Exception):
            raise look
        return look

    try:
        box.tmpfs_files, box.pid = 2000, stand_in.pid
        monkeypatch.setattr(box, "tmpfs_usage", usage)
        monkeypatch.setattr(box, "socket_bytes_held", lambda: 0)  # a stand-in has no network namespace to read
        box._watch()
        with pytest.raises(ProcessLookupError):  # killed, and reaped by end()
            os.kill(stand_in.pid, 0)
        assert box.watch["errors"] == 1 and box.watch["last_error"] == "OSError: a look that failed", box.watch
        assert box.watch["passes"] == 3 and box.watch["most_files"] == 2001, box.watch
        assert box.ended_because.startswith("it kept 2001 files (1 MiB) in /tmp, more than the 2000 files"), \
            box.ended_because
    finally:
        stand_in.kill()
        box.pid = None
        box.close()


def test_bytes_a_helper_process_carries_are_not_hidden_from_the_byte_rules(routes):
    """Rank 0 sends 4 MiB to rank 1 from a process it started: the ranks' own connections carried almost
    nothing, so the per-pair counts would say rank 0 sent nothing; the loopback's count gives it away."""
    helper = routes["through_a_helper"]
    assert helper["error"] == "MeasurementRefused", helper
    assert "went through a process that is not a rank" in helper["message"], helper


def test_no_folder_holding_the_sandboxes_is_shown_to_a_submission(monkeypatch):
    """A judge started from a script in /tmp has /tmp on its path; bound into a sandbox, it would show
    the scratch folders of the submissions graded beside it."""
    import tempfile

    from course_lib.grading import sandbox

    monkeypatch.setattr(sys, "path", [*sys.path, tempfile.gettempdir(), "/", os.path.dirname(tempfile.gettempdir())])
    shown = sandbox._read_only_paths()
    assert not [path for path in shown if (os.path.realpath(tempfile.gettempdir()) + "/").startswith(path.rstrip("/") + "/")]
    assert sys.prefix in shown
