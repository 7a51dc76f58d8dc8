"""Keep the ranks of a graded launch apart: what one rank knows reaches another only over the network.

Runs in each rank, inside the submission's sandbox (course_lib.grading.sandbox), before any of the
learner's code. The sandbox keeps a submission away from the judge, the host and the other
submissions; this module keeps the ranks of one launch away from each other. Without it, rank 0
could write its input to a file in the sandbox's shared folder (or ``/dev/shm``) and rank 1 could
read it: an "all-reduce" that never crosses the network, whose result a check could not tell from a
real one, and whose bytes between the ranks (course_lib.confine.tcp_flows) would be zero only where
the check counts them.

The tool is Landlock (Linux 5.13 and later; ``landlock_restrict_self(2)``), which an unprivileged
process applies to itself and every process it starts, for good: nothing can lift it. Each rank
makes a domain of its own:

- files: it may read the system, Python and course_lib, and read (not write) the sandbox's shared
  folder; it may write only to a folder of its own (its working directory, ``TMPDIR`` and
  ``HOME``) and to the folders the check shares with every rank (a checkpoint folder);
- processes: it cannot trace, or read the memory or ``/proc/<pid>/{root,cwd,fd,mem,environ}`` of,
  a process outside its domain (another rank, the launch server): Landlock's ptrace rule;
- with Landlock ABI 6 (Linux 6.12), it cannot connect to an abstract Unix socket, or signal a
  process, of another domain.

- sockets (seccomp, ``deny_side_sockets``), an allowlist: it may make TCP sockets, netlink sockets to
  the kernel's routing tables and Unix socket pairs, and nothing else (no Unix socket of its own, no
  UDP, SCTP, vsock, other netlink...); it cannot use io_uring, make System V or POSIX IPC objects,
  touch the kernel's keyrings, or start a session (its CPU share is its submission's).

What is left between two ranks: TCP on the sandbox's loopback (what ``tcp_flows`` counts per pair of
ranks), the folders a check shares, and what every process may read of another (``/proc/<pid>/stat``,
``cmdline``, ``comm``): a few bytes at a time, a covert channel rather than a way to move tensors.
"""

from __future__ import annotations

import ctypes
import os
import platform
import socket
import struct
import sys

__all__ = ["landlock_abi", "keep_rank_apart", "deny_side_sockets", "sessions_become_process_groups"]

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on x86-64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE_AND_REMOVE = sum(1 << bit for bit in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6

READ = EXECUTE | READ_FILE | READ_DIR
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def _syscall():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers (0: none, or not Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _syscall()
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def _handled_fs(abi: int) -> int:
    handled = READ | WRITE_FILE | _MAKE_AND_REMOVE
    if abi >= 2:
        handled |= REFER
    if abi >= 3:
        handled |= TRUNCATE
    return handled


def _fail(what: str) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"keeping the rank apart: {what} failed: {os.strerror(errno)}")


def keep_rank_apart(private: str, shared: list[str], readable: list[str]) -> int:
    """Restrict this process (and all it will start) as the module docstring says; return the ABI used.

    ``private``: this rank's own folder (made here); ``shared``: folders every rank of the launch
    may write; ``readable``: folders to read besides the system's (the sandbox's shared folder).
    Must run while the process has one thread (Landlock applies to the calling thread and what it
    starts afterwards; every rank calls it first thing)."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel (Linux 5.13 or later, with landlock among "
                      "its security modules: see /sys/kernel/security/lsm)")
    handled = _handled_fs(abi)
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attributes = struct.pack("QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("QQ", handled, 0) if abi >= 4 \
        else struct.pack("Q", handled)
    libc = _syscall()
    buffer = ctypes.create_string_buffer(attributes, len(attributes))
    ruleset = libc.syscall(_CREATE_RULESET, buffer, ctypes.c_size_t(len(attributes)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("landlock_create_ruleset")
    os.makedirs(private, mode=0o700, exist_ok=True)
    try:
        grants = [(path, READ) for path in _system_paths() + list(readable)]
        grants += [(device, READ_FILE | WRITE_FILE | (TRUNCATE & handled)) for device in [*DEVICES, *_gpu_devices()]]
        grants += [(path, handled) for path in [private, *shared]]
        for path, access in grants:
            _allow(libc, ruleset, path, access & handled)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise _fail("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _gpu_devices() -> list[str]:
    """A GPU grader's device files (CUDA opens /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia0, ...): the
    sandbox binds them in, and a rank may use them (Landlock leaves their ioctls alone here)."""
    import glob

    return sorted(glob.glob("/dev/nvidia*"))


def _allow(libc, ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not in this sandbox (no /dev/tty, say): nothing to allow
    try:
        if not os.path.isdir(path):  # a file takes only rights that apply to files
            access &= EXECUTE | READ_FILE | WRITE_FILE | TRUNCATE
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if libc.syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), rule,
                        ctypes.c_uint32(0)) != 0:
            raise _fail(f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _system_paths() -> list[str]:
    """Everything at the sandbox's root but /tmp and /dev (which hold the shared folders), and
    Python's own paths, wherever they are (a course cloned below /tmp)."""
    paths = [os.path.join("/", name) for name in os.listdir("/") if name not in ("tmp", "dev")]
    paths += [sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    paths += [entry for entry in sys.path if entry and os.path.isabs(entry)]
    return sorted(set(paths))


# ----- sockets beside the process group (seccomp): an allowlist
# A rank may make what torch and gloo use, and nothing else:
# - TCP over IPv4 or IPv6 (SOCK_STREAM with protocol 0 or IPPROTO_TCP): the process group's connections,
#   and any of the rank's own, which tcp_flows counts between the ranks;
# - netlink to the kernel's routing tables (NETLINK_ROUTE): if_nameindex() and getifaddrs(), through which
#   the launcher and gloo find the loopback interface (GLOO_SOCKET_IFNAME) for every group made; a process
#   without CAP_NET_ADMIN (no rank has it) can send there only to the kernel, never to another socket;
# - a connected pair of Unix sockets (socketpair(2)): it reaches no other process than the rank's own
#   children, and Python's multiprocessing.Pipe makes one.
# Every other family, type and protocol is refused with EPERM: Unix sockets (an abstract one is a channel
# between ranks where Landlock is older than ABI 6), UDP and ping sockets (datagrams the per-connection
# counts would not see), SCTP and MPTCP (streams that are not TCP), other netlink families (NETLINK_USERSOCK
# carries data between two unprivileged processes), vsock, TIPC, packet and the rest. Refused outright:
# io_uring_setup/enter/register (io_uring makes and connects sockets without calling socket(2)); shmget,
# semget, msgget and mq_open (System V and POSIX IPC objects outlive the processes that made them: a
# sandbox emptied for the next submission must hold nothing of the last one's); add_key, request_key and
# keyctl (the kernel's keyrings outlive the processes too, and are shared by every process of a user);
# setsid (with the kernel's autogroups, every session gets as much of the CPU as any other: a submission that
# put each of a hundred busy processes in a session of its own would take a hundred shares from the
# submissions graded beside it; course_lib.confine.cgroups.cpu_sharing). A program that asks subprocess for a
# new session (torchrun's agent does, for each worker) gets a process group of its own instead
# (``sessions_become_process_groups``): what it signals with os.killpg is the same group of processes.
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_NETLINK_ROUTE, _IPPROTO_TCP = 0, 6
# Per machine: the audit arch, the numbers of socket(2) and socketpair(2), those refused outright (io_uring's
# three, the IPC four, the keyring three, setsid) and, on x86-64, the x32 ABI's bit.
_MACHINES = {"x86_64": (0xC000003E, 41, 53, (425, 426, 427, 29, 64, 68, 240, 248, 249, 250, 112), 0x40000000),
             "aarch64": (0xC00000B7, 198, 199, (425, 426, 427, 194, 190, 186, 180, 217, 218, 219, 157), None)}
_LD, _JEQ, _JGE, _AND, _RET = 0x20, 0x15, 0x35, 0x54, 0x06  # classic BPF: ld [k], jeq, jge, and, ret
_ARG0, _ARG1, _ARG2 = 16, 24, 32  # seccomp_data.args[i]'s low 32 bits (the kernel reads these as ints)


def _filter(machine: str) -> tuple[bytes, int]:
    """The seccomp program (classic BPF over struct seccomp_data) and its length in instructions."""
    arch, socket_nr, socketpair_nr, refused, x32 = _MACHINES[machine]
    code, labels = [], {}

    def emit(op, k, jump_true=None, jump_false=None):
        code.append((op, jump_true, jump_false, k))

    def label(name):
        labels[name] = len(code)

    emit(_LD, 4)                                     # seccomp_data.arch
    emit(_JEQ, arch, None, "deny")                   # another ABI (i386 through int 0x80, arm32): refused
    emit(_LD, 0)                                     # seccomp_data.nr
    if x32 is not None:
        emit(_JGE, x32, "deny")
    for number in refused:
        emit(_JEQ, number, "deny")
    emit(_JEQ, socket_nr, "socket")
    emit(_JEQ, socketpair_nr, "socketpair", "allow")  # any other system call: allowed
    label("socket")
    emit(_LD, _ARG0)                                 # the address family
    emit(_JEQ, socket.AF_INET, "inet")
    emit(_JEQ, socket.AF_INET6, "inet")
    emit(_JEQ, socket.AF_NETLINK, "netlink", "deny")
    label("inet")
    emit(_LD, _ARG1)                                 # the type (flags in its high bits)
    emit(_AND, 0xF)
    emit(_JEQ, socket.SOCK_STREAM, None, "deny")
    emit(_LD, _ARG2)                                 # the protocol: TCP's, or the default (TCP's)
    emit(_JEQ, 0, "allow")
    emit(_JEQ, _IPPROTO_TCP, "allow", "deny")
    label("netlink")
    emit(_LD, _ARG2)
    emit(_JEQ, _NETLINK_ROUTE, "allow", "deny")
    label("socketpair")
    emit(_LD, _ARG0)
    emit(_JEQ, socket.AF_UNIX, "allow", "deny")
    label("allow")
    emit(_RET, _RET_ALLOW)
    label("deny")
    emit(_RET, _RET_EPERM)

    def offset(name, index):  # jumps count the instructions to skip after this one
        return 0 if name is None else labels[name] - index - 1

    packed = b"".join(struct.pack("HBBI", op, offset(yes, index), offset(no, index), k)
                      for index, (op, yes, no, k) in enumerate(code))
    return packed, len(code)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny_side_sockets() -> bool:
    """Allow this process and all it starts only the sockets above (TCP, the kernel's routing netlink, a Unix
    socketpair); refuse io_uring, IPC objects and keyrings. False where this machine's system call numbers
    are not known here (then nothing is refused)."""
    machine = platform.machine()
    if not sys.platform.startswith("linux") or machine not in _MACHINES:
        return False
    packed, count = _filter(machine)
    instructions = ctypes.create_string_buffer(packed, len(packed))
    program = _Program(count, ctypes.addressof(instructions))
    libc = _syscall()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _fail("prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise _fail("prctl(PR_SET_SECCOMP)")
    return True


def sessions_become_process_groups() -> None:
    """subprocess.Popen(start_new_session=True) makes a process group of its own instead (``process_group=0``),
    since the filter above refuses setsid, in this process and in every Python it starts (a ``sitecustomize``
    first on their path: course_lib/confine/sessions_as_groups). torchrun's agent starts each worker so and
    ends it with os.killpg(worker.pid), which a process group answers the same way."""
    from .sessions_as_groups import sitecustomize

    sitecustomize.sessions_become_process_groups()
    folder = os.path.dirname(os.path.abspath(sitecustomize.__file__))
    sys.path.insert(0, folder)  # a launcher that builds its children's path from sys.path keeps it first too
    os.environ["PYTHONPATH"] = os.pathsep.join([folder, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
