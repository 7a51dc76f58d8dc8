"""Hostile learner-side code run in one grading sandbox, as tests/test_sandbox.py asks.

Run as a script: becomes a judge (as grade.py's kernel does), launches each route's code on the
learner side inside a sandbox, and prints one JSON line per route with what happened. Each
route is code a submission could put in an answer cell; the judge's replies are the facts.
"""

import atexit
import ctypes
import json
import multiprocessing
import os
import platform
import shutil
import socket
import struct
import sys
import tempfile
import time

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

os.environ["COURSE_GRADING"] = "1"
os.environ["INSTRUCTOR_API_TOKEN"] = "secret-token-of-the-instructor"

from course_lib.grading import judge  # noqa: E402
from course_lib.grading import sandbox as sandbox_module  # noqa: E402

judge.become_judge()
SETUP = "import os, sys, time, socket, subprocess\nimport torch\nimport torch.distributed as dist"
learner = judge.Learner(answers=(), setup=SETUP)
outcomes = {}


def outcome(name, fn, *args, **kwargs):
    try:
        value = fn(*args, **kwargs)
        outcomes[name] = {"ok": True, "value": value}
    except Exception as exc:  # noqa: BLE001 - a LaunchError, or whatever else the judge raised: reported
        outcomes[name] = {"ok": False, "error": type(exc).__name__, "message": str(exc)[:600]}
    print(json.dumps({name: outcomes[name]}, default=str), flush=True)


# ---- what a host-side listener (the judge's kernel, another learner) exposes
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
HOST_PORT = listener.getsockname()[1]
SOLUTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "solutions")
secret_dir = tempfile.mkdtemp(prefix="classmate-")
atexit.register(shutil.rmtree, secret_dir, True)
with open(os.path.join(secret_dir, "answer.ipynb"), "w") as f:
    f.write("a classmate's notebook")


def looks_around(host_port, solutions, classmate):
    found = {"uid": os.getuid(), "pids_seen": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
    for name, path in (("solutions", solutions), ("classmate", classmate), ("root", "/root"), ("tmp", "/tmp")):
        try:
            found[name] = sorted(os.listdir(path))
        except OSError as exc:
            found[name] = f"refused: {exc.strerror}"
    try:
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()
        found["host_port"] = "connected"
    except OSError as exc:
        found["host_port"] = f"refused: {exc.strerror or exc}"
    found["environment_token"] = os.environ.get("INSTRUCTOR_API_TOKEN")
    found["authkey"] = bytes(multiprocessing.current_process().authkey).hex()  # multiprocessing's secret
    found["argv"] = sys.argv
    try:
        os.kill(os.getppid(), 0)
        found["signal_parent"] = "allowed (inside the sandbox)"
    except OSError as exc:
        found["signal_parent"] = exc.strerror
    return found


outcome("looks_around", learner.call, looks_around, HOST_PORT, SOLUTIONS, secret_dir)
# How this judge made its sandbox: as root with cgroups, or as an ordinary user with RLIMIT_NPROC.
outcomes["judge"] = {"euid": os.geteuid(), "cgroups": learner.sandbox().cgroups is not None}
JUDGES = {"authkey": bytes(multiprocessing.current_process().authkey).hex(), "argv": sys.argv}


def leaves_a_daemon(marker):
    if os.fork() == 0:
        os.setpgid(0, 0)  # out of the rank's process group (a session of its own is refused: see starts_sessions)
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        os._exit(0)
    time.sleep(0.3)
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


outcome("leaves_a_daemon", learner.call, leaves_a_daemon, None)
daemons_inside = learner.sandbox().processes_inside()


FORK_BOMB = """
import os, sys, time
children = 0
try:
    for _ in range(5000):
        if os.fork() == 0:
            os.closerange(0, 3)  # the parent's output pipe closes when the parent is done
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as exc:
    print(children, exc.strerror)
else:
    print(children, "")
"""


def fork_bomb(code):
    # Forked from a bare Python (no torch in its memory), so each fork is cheap and the route's time
    # is the limit's, not the copying of a large process's page tables on a busy machine.
    import subprocess

    start = time.monotonic()
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=50)
    children, _, stopped_by = out.stdout.strip().partition(" ")
    return {"children": int(children or -1), "stopped_by": stopped_by or None, "stderr": out.stderr[-300:],
            "seconds": round(time.monotonic() - start, 1)}


outcome("fork_bomb", learner.call, fork_bomb, FORK_BOMB, timeout=60)
learner.end_sandbox()  # the next submission: a new sandbox, nothing of the last one's left
deadline = time.monotonic() + 30  # the kernel tears a pid namespace down after its init dies, not at once
while time.monotonic() < deadline:
    alive_after = [pid for pid in daemons_inside if os.path.exists(f"/proc/{pid}")]
    if not alive_after:
        break
    time.sleep(0.1)
outcomes["daemon_gone"] = {"alive_after": alive_after}
print(json.dumps({"daemon_gone": outcomes["daemon_gone"]}), flush=True)


def huge_result():
    return torch.zeros(300 << 20, dtype=torch.uint8)  # 300 MiB


outcome("huge_result", learner.call, huge_result, timeout=60)


def expanded_result():
    return torch.zeros(1).expand(1 << 34)  # 4 bytes of data claiming 64 GiB: a check's torch.cat would allocate them


outcome("expanded_result", learner.call, expanded_result, timeout=60)


def sends_to_dev_null_and_shrinks_its_output(n):
    # The tensor's bytes "sent" without a peer: written to /dev/null, and stdout grown by ftruncate
    # (which once lowered what the launcher subtracted for the output files).
    data = torch.zeros(n, dtype=torch.uint8).numpy().tobytes()
    with open("/dev/null", "wb") as sink:
        sink.write(data)
    try:
        os.ftruncate(1, 1 << 30)
        truncated = "yes"
    except OSError as exc:
        truncated = exc.strerror
    return truncated


outcome("dev_null", learner.launch, sends_to_dev_null_and_shrinks_its_output, 2, args=(1 << 20,), measure=True)


def helper_holds_memory(n):
    if dist.get_rank() == 0:
        read_end, write_end = os.pipe()
        if os.fork() == 0:
            block = bytearray(n)
            for i in range(0, n, 4096):
                block[i] = 1
            os.write(write_end, b"x")
            time.sleep(5)
            os._exit(0)
        os.read(read_end, 1)
        time.sleep(0.5)
    dist.barrier()
    return dist.get_rank()


outcome("helper_memory", learner.launch, helper_holds_memory, 2, args=(400 << 20,), measure=True)


def keeps_memory_in_files(n):
    # Rank 0 keeps n bytes in a file of its folder (a tmpfs: memory) and n in a memory file it never maps,
    # out of its resident size, while it is measured.
    if dist.get_rank() == 0:
        with open("kept", "wb") as f:
            f.write(bytes(n))
        import mmap

        memory_file = os.memfd_create("kept")  # filled through a mapping, then unmapped: no write(2) counts it
        os.ftruncate(memory_file, n)
        with mmap.mmap(memory_file, n) as view:
            for start in range(0, n, 1 << 20):
                view[start:start + (1 << 20)] = b"\1" * (1 << 20)
    dist.barrier()
    return dist.get_rank()


outcome("memory_in_files", learner.launch, keeps_memory_in_files, 2, args=(200 << 20,), measure=True)


def all_reduce_plain(n):
    t = torch.ones(n)
    dist.all_reduce(t)
    print("a line of output that must not count as bytes sent")
    return float(t[0])


outcome("honest_all_reduce", learner.launch, all_reduce_plain, 4, args=(1 << 18,), measure=True)


def exits_before_measured():
    import threading

    if dist.get_rank() == 0:  # gone right after its result, while rank 1 still works
        threading.Timer(0.05, lambda: os._exit(0)).start()
    else:
        time.sleep(1)
    return 1


outcome("exits_early", learner.launch, exits_before_measured, 2, measure=True)


def broadcasts_from_every_rank(mine):
    for source in range(dist.get_world_size()):
        buffer = mine.clone() if source == dist.get_rank() else torch.empty_like(mine)
        dist.broadcast(buffer, src=source)
    return dist.get_rank()


def all_gather_hidden_from_the_rank(mine):
    # The built-in all-gather, out of reach of any log kept in the rank (dispatch modes are off).
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        dist.all_gather([torch.empty_like(mine) for _ in range(dist.get_world_size())], mine)
    return dist.get_rank()


FLOW_INPUTS = [(torch.full((1 << 16,), float(r)),) for r in range(4)]  # 256 KiB a rank
outcome("broadcast_flows", learner.launch, broadcasts_from_every_rank, 4, rank_args=FLOW_INPUTS, measure=True)
outcome("hidden_all_gather_flows", learner.launch, all_gather_hidden_from_the_rank, 4, rank_args=FLOW_INPUTS,
        measure=True)
outcome("reference_broadcast_flows", learner.reference_flows, broadcasts_from_every_rank, 4, FLOW_INPUTS)


def sends_through_a_helper(n):
    # Rank 0's bytes reach rank 1 from a process it starts: no connection of rank 0 carries them.
    import subprocess

    port = torch.tensor([0])
    if dist.get_rank() == 1:
        server = socket.create_server(("127.0.0.1", 0))
        port[0] = server.getsockname()[1]
    dist.broadcast(port, src=1)
    if dist.get_rank() == 0:
        subprocess.run([sys.executable, "-c", "import socket, sys; socket.create_connection(('127.0.0.1', "
                        f"{int(port)})).sendall(bytes({n}))"], check=True, timeout=30)
        return 0
    connection, _ = server.accept()
    got = 0
    while got < n:
        got += len(connection.recv(1 << 20))
    return got


outcome("through_a_helper", learner.launch, sends_through_a_helper, 2, args=(4 << 20,), measure=True)


def rank_inputs(mine):
    # Walk up every frame: only this rank's own tensor is anywhere in the process.
    seen = []
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, torch.Tensor):
                seen.append(float(value.sum()))
        frame = frame.f_back
    return sorted(set(seen))


outcome("frames", learner.launch, rank_inputs, 3, rank_args=[(torch.full((4,), 10.0 ** r),) for r in range(3)])


TRACKER_MARKER = "a-line-from-the-learner-side"


def writes_to_the_resource_tracker(marker):
    # multiprocessing hands every process it starts the pipe to a "resource tracker": a process that unlinks the
    # shared memory a program leaves behind when it ends. The judge's runs outside, as the judge: a line that
    # reached it would have it unlink a file of the host's /dev/shm, print on the judge's stderr, or hold a line
    # that never ends in its memory. Here: a line naming a kind it does not know, which it would print.
    from multiprocessing import resource_tracker

    fd = resource_tracker._resource_tracker._fd
    os.write(fd, f"REGISTER:{marker}:no-such-kind\n".encode())
    return os.readlink(f"/proc/self/fd/{fd}")


outcome("resource_tracker", learner.launch, writes_to_the_resource_tracker, 2, args=(TRACKER_MARKER,))


def ranks_apart(shared):
    # Rank 1 leaves its secret everywhere it can; rank 0 looks for it everywhere (each rank's pid and
    # folder travel over the process group, a real collective). What rank 0 found, by route.
    rank = dist.get_rank()
    secret = "the input of rank 1"
    places = {"tmp": "/tmp/from-rank-1", "dev_shm": "/dev/shm/from-rank-1", "working_dir": "from-rank-1",
              "scratch": os.path.join(os.path.dirname(shared), "from-rank-1"), "shared": os.path.join(shared, "from-rank-1")}
    wrote, listener = {}, None
    if rank == 1:
        for name, path in places.items():
            try:
                with open(path, "w") as f:
                    f.write(secret)
                wrote[name] = "written"
            except OSError as exc:
                wrote[name] = f"refused: {exc.strerror}"
        try:
            listener = socket.socket(socket.AF_UNIX)
            listener.bind("\0course-ranks-apart")
            listener.listen()
            wrote["abstract_socket"] = "listening"
        except OSError as exc:
            wrote["abstract_socket"] = f"refused: {exc.strerror}"
        try:  # netlink's USERSOCK family carries datagrams between two unprivileged processes, by port id
            inbox = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)
            inbox.bind((os.getpid(), 0))
            wrote["netlink"] = "listening"
        except OSError as exc:
            wrote["netlink"] = f"refused: {exc.strerror}"
        # The kernel's keyrings: a user keyring outlives every process of the sandbox's user (-4: its own).
        libc = ctypes.CDLL(None, use_errno=True)
        add_key = {"x86_64": 248, "aarch64": 217}[platform.machine()]
        made = libc.syscall(add_key, b"user", b"from-rank-1", secret.encode(), len(secret), -4)
        wrote["keyring"] = "written" if made >= 0 else f"refused: {os.strerror(ctypes.get_errno())}"
    who = [None, None]
    dist.all_gather_object(who, (os.getpid(), os.getcwd()))
    found = {}
    if rank == 0:
        peer_pid, peer_dir = who[1]
        reads = dict(places, working_dir=os.path.join(peer_dir, "from-rank-1"),
                     proc_root=f"/proc/{peer_pid}/root/tmp/from-rank-1", proc_cwd=f"/proc/{peer_pid}/cwd/from-rank-1",
                     proc_environ=f"/proc/{peer_pid}/environ", proc_mem=f"/proc/{peer_pid}/mem")
        for name, path in reads.items():
            try:
                with open(path, "rb") as f:
                    found[name] = "read" if name in ("proc_environ", "proc_mem") or secret.encode() in f.read() else "empty"
            except OSError as exc:
                found[name] = f"refused: {exc.strerror}"
        try:
            client = socket.socket(socket.AF_UNIX)
            client.connect("\0course-ranks-apart")
            found["abstract_socket"] = "connected"
        except OSError as exc:
            found["abstract_socket"] = f"refused: {exc.strerror}"
        try:
            os.kill(peer_pid, 0)
            found["signal"] = "allowed"
        except OSError as exc:
            found["signal"] = f"refused: {exc.strerror}"
        # The launch server (Python's forkserver) listens on a Unix socket: a process that reached it would have
        # the server fork it a child outside the rank's domain. The judge binds it, outside: not listed here.
        with open("/proc/net/unix") as f:
            paths = [line.split()[-1] for line in f.read().splitlines()[1:] if len(line.split()) == 8]
        found["launch_server_socket"] = f"refused: none listed ({len(paths)})"
        for path in paths:
            try:
                client = socket.socket(socket.AF_UNIX)
                client.connect(path)
                found["launch_server_socket"] = f"connected to {path}"
                break
            except OSError as exc:
                found["launch_server_socket"] = f"refused: {exc.strerror} ({path})"
        try:
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
            found["udp"] = "sent"
        except OSError as exc:
            found["udp"] = f"refused: {exc.strerror}"
        try:
            socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2).sendto(secret.encode(), (peer_pid, 0))
            found["netlink"] = "sent"
        except OSError as exc:
            found["netlink"] = f"refused: {exc.strerror}"
        libc = ctypes.CDLL(None, use_errno=True)
        request_key = {"x86_64": 249, "aarch64": 218}[platform.machine()]
        key = libc.syscall(request_key, b"user", b"from-rank-1", None, 0)
        found["keyring"] = "found" if key >= 0 else f"refused: {os.strerror(ctypes.get_errno())}"
    dist.barrier()
    return {"wrote": wrote, "found": found, "cwd": os.getcwd()}


shared_folder = tempfile.mkdtemp(dir=learner.scratch, prefix="shared-")
outcome("ranks_apart", learner.launch, ranks_apart, 2, args=(shared_folder,), shared=[shared_folder])


def leaves_things_behind(shared):
    # A detached daemon, a file in the rank's own folder and one in the folder the check shares.
    leaves_a_daemon(None)
    with open("left-behind", "w") as f, open(os.path.join(shared, "left-behind"), "w") as g:
        f.write("mine")
        g.write("shared")
    return [os.path.abspath("left-behind"), os.path.join(shared, "left-behind")]


def finds_what_was_left(paths):
    found = {}
    for path in paths:
        try:
            found[path] = open(path).read()
        except OSError as exc:
            found[path] = f"refused: {exc.strerror}"
    return found


# One sandbox graded every submission of a judge in turn: emptied between two (judge.next_submission).
box = learner.sandbox()
left = learner.launch(leaves_things_behind, 1, args=(shared_folder,), shared=[shared_folder])[0]
processes_before = len(box.processes_inside())
reused = learner.empty_sandbox()
outcomes["emptied"] = {"reused": reused, "same_sandbox": learner.sandbox() is box,
                       "processes_before": processes_before, "processes_after": len(box.processes_inside()),
                       "left_in_writable_folders": sorted(str(p) for folder in box._writable_folders()
                                                          for p in box.left_in(folder))}
outcome("after_emptying", learner.call, finds_what_was_left, left)
learner.end_sandbox()


# ---- what the learner side may keep in its own folders (/tmp holds every rank's), with small limits
box = learner.sandbox()
box.tmpfs_bytes, box.tmpfs_files = 64 << 20, 2000  # before its first launch: the sizes bwrap is given


def fills_its_folder(chunk):
    written, error = 0, None
    try:
        for part in range(1000):
            with open(f"part-{part}", "wb") as f:
                for _ in range(8):
                    f.write(b"\0" * chunk)
                    written += chunk
    except OSError as exc:
        error = exc.strerror
    return {"written": written, "error": error, "folder": os.getcwd()}


outcome("fills_its_folder", learner.call, fills_its_folder, 4 << 20)
outcomes["on_the_hosts_disk"] = sum(os.lstat(os.path.join(root, name)).st_size
                                    for root, _, names in os.walk(box.folder) for name in names)


def makes_many_files(n):
    assert os.getcwd().startswith("/tmp/rank-"), os.getcwd()  # /tmp is full (the route above): still its folder
    for i in range(n):
        open(f"empty-{i}", "w").close()
    time.sleep(20)  # the judge's watchdog ends the sandbox meanwhile
    return n


outcome("many_files", learner.call, makes_many_files, 20_000, timeout=60)
outcomes["many_files_watch"] = dict(box.watch, ended_because=box.ended_because)  # what the watchdog saw
learner.end_sandbox()


# ---- kernel memory in sockets nobody reads: no process's resident size shows it (here a limit of 32 MiB)
box = learner.sandbox()
box.socket_bytes = 32 << 20


def fills_socket_queues(target):
    """Datagrams queued on Unix socket pairs and netlink replies queued on routing sockets, never read:
    the kernel keeps them, outside every process's memory."""
    kept, held = [], 0
    request = struct.pack("=IHHII", 32, 18, 1, 1, 0) + struct.pack("=BxHiII", 0, 0, 1, 0, 0)  # RTM_GETLINK, lo
    while held < target and len(kept) < 4000:
        sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        sender.setblocking(False)
        try:
            while True:
                held += sender.send(bytes(32768))
        except OSError:
            pass
        routing = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        routing.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        for _ in range(200):
            routing.send(request * 64)
        kept += [sender, receiver, routing]
    time.sleep(20)  # the judge's watchdog ends the sandbox meanwhile
    return held


outcome("socket_queues", learner.call, fills_socket_queues, 256 << 20, timeout=60)
outcomes["socket_queues_watch"] = dict(box.watch, ended_because=box.ended_because)
learner.end_sandbox()


# ---- sessions: with the kernel's autogroups, each session weighs as much as any other; a submission's busy
# processes in a hundred sessions would take a hundred shares of the CPU from the submissions graded beside it
SPINNERS = """
import os, sys
for _ in range(int(sys.argv[1])):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            os.setpgid(0, 0)
        while True:
            pass
"""


def starts_sessions(spinners):
    import subprocess

    found = {}
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            os._exit(0)
        except OSError as exc:
            os._exit(exc.errno)
    found["setsid_errno"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    # What torchrun's agent does for each worker: start_new_session=True, later os.killpg(worker.pid, sig).
    worker = subprocess.Popen([sys.executable, "-S", "-c", "import os; print(os.getpgid(0), os.getsid(0))"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    group, session = map(int, worker.communicate(timeout=30)[0].split())
    found["popen"] = {"own_group": group == worker.pid, "same_session": session == os.getsid(0)}
    # torchrun's agent is a Python of its own that starts the workers: the same holds there.
    agent = ("import os, subprocess, sys\n"
             "w = subprocess.Popen([sys.executable, '-S', '-c', 'import os; print(os.getpgid(0), os.getsid(0))'],"
             " start_new_session=True, stdout=subprocess.PIPE, text=True)\n"
             "group, session = map(int, w.communicate()[0].split())\n"
             "print(group == w.pid, session == os.getsid(0))\n")
    found["agents_popen"] = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True,
                                           timeout=60).stdout.split()
    subprocess.run([sys.executable, "-S", "-c", SPINNERS, str(spinners)], check=True, timeout=60)
    return found


def autogroup_of(pid):
    try:
        return open(f"/proc/{pid}/autogroup").read().split()[0]
    except OSError:
        return None


box = learner.sandbox()
outcome("starts_sessions", learner.call, starts_sessions, 20)
time.sleep(0.5)
inside = box.processes_inside()[1:]  # bwrap's own process (outside the pid namespace) runs nothing of the learner's
outcomes["cpu_share"] = {"processes": len(inside), "autogroups": sorted({autogroup_of(pid) for pid in inside} - {None}),
                         "cpu_cgroup": box.cgroups is not None and any(d.parent.name == "cpu" for d in box.cgroups.dirs),
                         "holds_all": box.cgroups is not None and all(box.cgroups.holds(pid) for pid in inside)}
print(json.dumps({"cpu_share": outcomes["cpu_share"]}), flush=True)
learner.end_sandbox()


# ---- a launch server that has died (the OOM killer picks the biggest process in a sandbox: the server, which
# holds torch, when a submission spreads its memory over many smaller ones)
def judges_children():
    return {int(pid) for task in os.listdir("/proc/self/task")
            for pid in open(f"/proc/self/task/{task}/children").read().split()}


box = learner.sandbox()
learner.call(os.getpid)
before = judges_children()
os.kill(next(outside for outside, inside in box._inside_pids().items() if inside == 2), 9)
deadline = time.monotonic() + 30
while not sandbox_module._has_exited(box.pid) and time.monotonic() < deadline:
    time.sleep(0.05)
outcome("after_the_server_died", learner.call, looks_around, HOST_PORT, SOLUTIONS, secret_dir)
outcomes["started_outside"] = sorted(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:200]
                                     for pid in judges_children() - before if os.path.exists(f"/proc/{pid}"))
learner.end_sandbox()
print("ALL " + json.dumps(outcomes | {"judges_own": JUDGES}, default=str), flush=True)
