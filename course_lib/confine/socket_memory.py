"""Kernel memory held in sockets, read from outside the processes that hold it (Linux only).

Introduced with chapter 01's graded exercises. A submission's memory limit (a cgroup, or the judge's
watchdog adding up resident sizes) does not see what the kernel keeps for a socket: the datagrams
queued on a netlink or a Unix socket nobody reads, the bytes in a TCP socket's queues. A rank that
opens many sockets and fills their queues holds gigabytes of the machine's memory outside any limit
(netlink receive queues held 2.5 GiB before this count). The judge asks the kernel (``sock_diag``, as
``ss -m`` does) for every TCP, Unix and netlink socket of the sandbox's network namespace with its
memory, and ends the sandbox past a limit (course_lib.grading.sandbox).
"""

from __future__ import annotations

import socket
import struct

from . import sock_diag

__all__ = ["socket_memory"]

_MEMINFO = struct.Struct("=9I")  # SK_MEMINFO_*: rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, ...

# Per family: the request (its struct, packed) and where the reply's attributes start, and which attribute
# holds the socket's memory. inet_diag_req_v2 asks for INET_DIAG_SKMEMINFO (7) with bit 1 << 6; unix_diag_req
# shows UDIAG_SHOW_MEMINFO (0x20, attribute UNIX_DIAG_MEMINFO, 5); netlink_diag_req shows NDIAG_SHOW_MEMINFO (1,
# attribute 0) for every protocol (255).
_INET_REQUEST = struct.Struct("=BBBBI48x")  # family, protocol, extensions, pad, states; a zero socket id
_UNIX_REQUEST = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, inode, show, cookie
_NETLINK_REQUEST = struct.Struct("=BBHIIII")  # family, protocol, pad, inode, show, cookie


def _requests() -> dict[str, list[tuple[bytes, int, int]]]:
    every_state = 0xFFFFFFFF
    inet = [(_INET_REQUEST.pack(family, socket.IPPROTO_TCP, 1 << 6, 0, every_state), 72, 7)
            for family in (socket.AF_INET, socket.AF_INET6)]  # inet_diag_msg: 72 bytes
    return {"tcp": inet,
            "unix": [(_UNIX_REQUEST.pack(socket.AF_UNIX, 0, 0, every_state, 0, 0x20, 0, 0), 16, 5)],
            "netlink": [(_NETLINK_REQUEST.pack(socket.AF_NETLINK, 255, 0, 0, 1, 0, 0), 28, 0)]}


def socket_memory(diag: socket.socket) -> dict[str, int]:
    """Bytes of kernel memory the TCP, Unix and netlink sockets of ``diag``'s network namespace hold
    (``diag``: a NETLINK_SOCK_DIAG socket made there, course_lib.confine.tcp_flows.diag_socket). Each
    socket's receive queue, send queue and backlog, as the kernel counts them for its buffer limits."""
    held = {}
    for kind, requests in _requests().items():
        held[kind] = sum(_held(meminfo) for request, start, wanted in requests
                         for meminfo in _dump(diag, request, start, wanted))
    return held


def _held(meminfo: tuple[int, ...]) -> int:
    rmem_alloc, _, wmem_alloc, _, _, wmem_queued, _, backlog, _ = meminfo
    return rmem_alloc + max(wmem_alloc, wmem_queued) + backlog


def _dump(diag: socket.socket, request: bytes, start: int, wanted: int):
    """Each socket's SK_MEMINFO, from one sock_diag dump."""
    for message in sock_diag.dump(diag, request):
        found = sock_diag.attribute(message, start, wanted)
        if found is not None and len(found) >= _MEMINFO.size:
            yield _MEMINFO.unpack_from(found)
