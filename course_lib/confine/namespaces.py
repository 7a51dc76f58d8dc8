"""User and network namespaces by system call: make one, map this user into it, join one later.

Introduced with chapter 13 (course_lib.emulated_cluster). Linux only. An ordinary user may make a
user namespace where the kernel allows unprivileged ones (Debian, Ubuntu, Fedora and most others do);
inside it the user is root and may make network namespaces, veth pairs and traffic-control queues that
exist nowhere else. A process of the same user joins one later with ``enter`` (``setns(2)``), as
``nsenter`` does: first the user namespace, which gives it the rights, then the network namespace.

Python 3.11 has no os.unshare or os.setns: they are called through libc here.
"""

from __future__ import annotations

import ctypes
import os
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

__all__ = ["CLONE_NEWUSER", "CLONE_NEWNET", "unshare", "become_root_of_new_user_namespace", "enter",
           "namespaces_problem"]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def unshare(flags: int) -> None:
    """unshare(2): this process leaves its namespaces of the kinds in ``flags`` for new ones."""
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def become_root_of_new_user_namespace(extra_flags: int = CLONE_NEWNET) -> None:
    """A new user namespace (and, by default, a network namespace owned by it) in which this process's
    user is root. Must run while the process has one thread. Nothing outside changes: the kernel still
    sees this process's own user id, so files it writes belong to the same user as before."""
    uid, gid = os.geteuid(), os.getegid()
    unshare(CLONE_NEWUSER | extra_flags)
    with open("/proc/self/setgroups", "w") as f:  # required before an unprivileged gid_map
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"0 {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"0 {gid} 1")


def enter(user_namespace: str, net_namespace: str) -> None:
    """Join a user namespace, then a network namespace it owns (paths such as /proc/PID/ns/user).
    Must run while the process has one thread (setns refuses a threaded process a user namespace)."""
    libc = _libc()
    for path, kind in ((user_namespace, CLONE_NEWUSER), (net_namespace, CLONE_NEWNET)):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(libc.setns(fd, ctypes.c_int(kind)), f"setns({path})")
        finally:
            os.close(fd)


def namespaces_problem() -> str | None:
    """Why this machine cannot make a user and a network namespace for an ordinary process, or None.
    Tries it, in a child process that exits at once."""
    if not sys.platform.startswith("linux"):
        return (f"emulated nodes need Linux's user and network namespaces; this is {sys.platform}. "
                "Run this part on Linux (a Linux machine, a Linux VM, or the class hub)")
    pid = os.fork()
    if pid == 0:  # the child tries, and reports by its exit status
        code = 0
        try:
            become_root_of_new_user_namespace()
        except OSError as exc:
            code = 10 + min(exc.errno or 0, 100)
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0:
        return None
    import errno as errnos

    reason = os.strerror(code - 10) if code >= 10 else f"exit status {code}"
    hint = ""
    if code - 10 in (errnos.EPERM, errnos.ENOSPC, errnos.EACCES):
        hint = (" The kernel refuses unprivileged user namespaces here: on Ubuntu 24.04 and later, AppArmor "
                "does (sysctl kernel.apparmor_restrict_unprivileged_userns); elsewhere see "
                "sysctl user.max_user_namespaces and kernel.unprivileged_userns_clone. In a container, "
                "its runtime may refuse them (Docker's default seccomp profile does)")
    return f"this machine would not make a user and a network namespace ({reason}).{hint}"
