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

import os
import socket
import struct

__all__ = ["socket_memory"]

_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 20, 0x1, 0x300, 2, 3
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
        held[kind] = sum(_held(meminfo) for request, start, attribute in requests
                         for meminfo in _dump(diag, request, start, attribute))
    return held


def _held(meminfo: tuple[int, ...]) -> int:
    rmem_alloc, _, wmem_alloc, _, _, wmem_queued, _, backlog, _ = meminfo
    return rmem_alloc + max(wmem_alloc, wmem_queued) + backlog


def _dump(diag: socket.socket, request: bytes, start: int, attribute: int):
    """Each socket's SK_MEMINFO, from one sock_diag dump."""
    diag.send(_NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP,
                                 1, 0) + request)
    while True:
        data = diag.recv(1 << 20)
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                error = -struct.unpack_from("=i", data, offset + _NLMSG_HEADER.size)[0]
                raise OSError(error, f"sock_diag: {os.strerror(error)}")
            message = data[offset + _NLMSG_HEADER.size:offset + length]
            found = _attribute(message, start, attribute)
            if found is not None and len(found) >= _MEMINFO.size:
                yield _MEMINFO.unpack_from(found)
            offset += (length + 3) & ~3
            if length < _NLMSG_HEADER.size:
                return  # a malformed reply: stop rather than loop


def _attribute(message: bytes, start: int, wanted: int) -> bytes | None:
    offset = start
    while offset + 4 <= len(message):  # (length, type, value), each 4-byte aligned
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            return None
        if kind == wanted:
            return message[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return None
