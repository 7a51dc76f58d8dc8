"""The kernel's socket tables, asked over netlink (``sock_diag``, what ``ss`` reads): one dump, its replies
read back (Linux only). Introduced with chapter 01's graded exercises; used by ``tcp_flows`` (the bytes
between ranks) and ``socket_memory`` (what sockets hold in the kernel)."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator

__all__ = ["dump", "attribute"]

_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3


def dump(diag: socket.socket, request: bytes) -> Iterator[bytes]:
    """Send one SOCK_DIAG_BY_FAMILY dump ``request`` (a family's *_diag_req, packed) on ``diag`` and yield
    each reply's message (its *_diag_msg and attributes), until the kernel says it is done."""
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
            if length < _NLMSG_HEADER.size:
                return  # a malformed reply: stop rather than loop
            yield data[offset + _NLMSG_HEADER.size:offset + length]
            offset += (length + 3) & ~3


def attribute(message: bytes, start: int, wanted: int) -> bytes | None:
    """The value of attribute ``wanted`` among a message's attributes, which begin at ``start``: (length,
    type, value) each, 4-byte aligned. None where it is not there."""
    offset = start
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            return None
        if kind == wanted:
            return message[offset + 4:offset + length]
        offset += (length + 3) & ~3
    return None
