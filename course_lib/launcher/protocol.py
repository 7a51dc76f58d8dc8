"""What travels between the parent and a rank: the spec each rank starts from, the frames it sends
back (a JSON header, then a result), and how functions, arguments and results are pickled.

Introduced in chapter 00 (preflight): ``fn`` travels by value (cloudpickle), so a function
defined in a notebook cell runs in a process that never saw the cell. ``_Judged`` and the data
results (``torch.save`` bytes, loaded as plain data only) came with grading (course_lib.grading).
"""

from __future__ import annotations

import collections
import io
import json
import pickletools
import signal
import types
import zipfile
from dataclasses import dataclass

import cloudpickle

from .errors import UnsendableResult, WorkerError

# The kinds of frame a rank sends, in the order it sends them.
_RESULT_BASELINE = "baseline"  # judged: what the worker had written before any learner code ran
_RESULT_STARTED = "started"
_RESULT_OK = "ok"
_RESULT_ERROR = "error"
_RESULT_UNSENDABLE = "unsendable"
# The parent sends it to a hung rank, which dumps its stack (faulthandler) to its stack file.
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # absent on Windows


@dataclass
class _WorkerSpec:
    rank: int
    world_size: int
    master_port: int
    backend: str | None  # None: fn initialises the process group itself
    payload: bytes  # cloudpickle of (fn, args, kwargs)
    out_path: str
    err_path: str
    stack_path: str
    progress_path: str
    threads: int
    pg_timeout_s: float
    kernel_pid: int | None  # None: the kernel is out of sight (a grading sandbox's own pid namespace)
    environment: dict  # the notebook's os.environ at launch time
    cwd: str
    sys_path: list
    judged: "_Judged | None" = None  # a grading launch: learner code in, data out (course_lib.grading)
    output_fds: tuple | None = None  # judged: (stdout, stderr, stacks) pipes the judge drains and counts
    node: dict | None = None  # an emulated node to join first (course_lib.emulated_cluster): its namespaces, address


@dataclass
class _Judged:
    """How a grading launch differs (see course_lib.grading.judge).

    The worker first runs ``prelude`` (the notebook's setup cell and the learner's answer
    cells, as source text) in a fresh ``__main__``, and sends back its result as *data*
    (``torch.save`` bytes the parent loads with ``weights_only=True``): no object the
    learner's code made is ever unpickled by the judge. ``run_as`` (uid, gid, home): a
    grader running as root starts the learner's code as an unprivileged user (without a
    sandbox). ``sandbox`` (course_lib.grading.sandbox.Sandbox): the launch server and every
    rank start inside it, and the judge measures them from outside.
    """

    prelude: list  # [(label, source), ...]
    run_as: tuple | None = None
    payloads: list | None = None  # per rank: (fn, args, kwargs) as the judge pickled them (answers by name)
    sandbox: object | None = None
    environment: dict | None = None  # what the ranks see of os.environ (None: the kernel's)
    cwd: str | None = None
    max_result_bytes: int = 256 << 20
    counts_bytes: bool = False  # the check counts bytes sent: bytes written elsewhere are refused
    memory_limit: int | None = None  # bytes a rank's memory may grow from its start: past them, every rank is stopped
    # In a sandbox: each rank in a Landlock domain of its own (course_lib.confine.apart), writing only
    # to a folder of its own and to these folders, which the check shares with every rank (None: not kept apart).
    apart: dict | None = None  # {"shared": [folder, ...], "readable": [folder, ...], "private_root": "/tmp"}

    def __getstate__(self):
        # What a rank receives: the cells to run. Never the other ranks' payloads (each rank's
        # own travels in its spec), the sandbox, or the environment (sent as the spec's).
        return {"prelude": self.prelude, "run_as": self.run_as, "apart": self.apart}

    def __setstate__(self, state):
        self.__init__(**state)


class _InheritedFd:
    """A file descriptor of the parent's that a worker receives (as its own copy) when it starts."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):  # forkserver and spawn: the descriptor travels beside the pickle
        from multiprocessing import reduction

        return _fd_in_worker, (reduction.DupFd(self.fd),)


def _fd_in_worker(duplicate) -> int:
    return duplicate.detach()


def _fd_of(inherited) -> int:
    return inherited.fd if isinstance(inherited, _InheritedFd) else inherited


# --------------------------------------------------------------------------
# Frames: a rank's messages to the parent
# --------------------------------------------------------------------------
def _report(conn, message, payload: bytes | None = None) -> None:
    # Headers are JSON, so reading a message never runs code the worker chose; a result
    # follows as a second frame (cloudpickle for lessons, torch.save data when judged).
    conn.send_bytes(json.dumps(message).encode("utf-8"))
    if payload is not None:
        conn.send_bytes(payload)


def _sendable(text) -> str:
    """Text a rank sent, as text that can be printed and sent on: JSON carries lone surrogates
    ("\\ud800"), which no UTF-8 stream (a kernel's output channel, a file) accepts; they are written
    escaped, as the characters \\ud800."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _read_header(conn, rank: int, world_size: int, had_baseline: bool) -> list:
    """A rank's next header, checked to be one of the launcher's messages (else a ProtocolError).

    ``had_baseline``: the rank has sent its baseline already (a second one is forged)."""
    raw = conn.recv_bytes(1 << 20)
    try:
        message = json.loads(raw.decode("utf-8"))
        if not isinstance(message, list) or not message or message[0] not in (
                _RESULT_STARTED, _RESULT_BASELINE, _RESULT_ERROR, _RESULT_UNSENDABLE, _RESULT_OK):
            raise ValueError
        if message[0] == _RESULT_BASELINE:
            if had_baseline or len(message) != 3 or not all(
                    isinstance(value, (int, type(None))) for value in message[1:]):
                raise ValueError  # once, before the learner's code: a second one is forged
        if message[0] in (_RESULT_ERROR, _RESULT_UNSENDABLE):
            _, exc_type, text, frames = message
            if not isinstance(exc_type, str) or not isinstance(text, str):
                raise ValueError
            frames = [(_sendable(f), int(n), _sendable(name), _sendable(line)) for f, n, name, line in frames]
            message = [message[0], _sendable(exc_type), _sendable(text), frames]
        return message
    except (ValueError, TypeError, UnicodeDecodeError):
        raise WorkerError(rank, "ProtocolError", "the worker sent a message that is not the launcher's", "",
                          world_size) from None


# --------------------------------------------------------------------------
# Pickling: fn and its arguments out, results back
# --------------------------------------------------------------------------
def _code_with_its_file(code):
    """cloudpickle's reduction of a code object, with the file name it had. cloudpickle 3.1.3 and
    later write "<dynamic-code>" instead (so that a pickle does not depend on where the code was
    defined); the rank's traceback would then no longer say which notebook cell raised."""
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)
    return constructor, tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)


class CodeFilePickler(cloudpickle.CloudPickler):
    """cloudpickle, keeping each function's file name (see _code_with_its_file)."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_with_its_file},
                                          cloudpickle.CloudPickler.dispatch_table)


def _dumps(obj) -> bytes:
    buffer = io.BytesIO()
    CodeFilePickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _serialise_call(fn, args, kwargs) -> bytes:
    """Pickle fn and its arguments by value, as a worker in another process needs them."""
    try:
        return _dumps((fn, tuple(args), kwargs))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        raise TypeError(
            f"fn or its arguments cannot be sent to the worker processes ({type(exc).__name__}: {exc}). "
            "Pass plain values, tensors or modules; create locks, open files, sockets and "
            "generators inside fn instead."
        ) from None


def _load_data(payload: bytes, rank: int, world_size: int, limit: int):
    """A judged rank's result: plain data only (tensors, numbers, strings, containers).
    The rank wrote it with torch.save (worker._data_payload)."""
    import torch

    too_many = _too_many_objects(payload)
    if too_many:
        raise UnsendableResult(rank, "ResultTooLarge", too_many, "", world_size)
    try:
        result = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception:  # noqa: BLE001 - anything that is not plain data
        raise UnsendableResult(rank, "TypeError", "the result is not plain data (tensors, numbers, strings, "
                               "and lists/tuples/dicts of them)", "", world_size) from None
    claimed = _claimed_bytes(result)
    if claimed > limit:
        # A view that repeats a little storage (expand: stride 0) arrives small and claims any size:
        # a check that copies it (torch.cat, .clone()) would allocate all of it in the judge.
        raise UnsendableResult(rank, "ResultTooLarge", f"the result's tensors claim {claimed / 2**20:.0f} MiB "
                               f"(more than the {limit / 2**20:g} MiB a check accepts) in {len(payload) / 2**20:.1f} "
                               "MiB of data: views that repeat their elements", "", world_size)
    return result


# What a result may hold besides its tensors' elements: the pickle that lists its numbers, strings and
# containers. Ten million empty lists are 60 MB of pickle, which torch.load turns into 1.5 GiB of the judge's
# memory over minutes; these bounds keep one result to a few tens of MB and a second or two.
MAX_PLAIN_BYTES = 8 << 20
MAX_PLAIN_ITEMS = 1_000_000


def _too_many_objects(payload: bytes) -> str | None:
    """Why a torch.save payload's plain data is too large to load in the judge, or None. Read without
    loading it: the size of its pickle, then its opcodes (each object costs at least one), counted."""
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            names = [name for name in archive.namelist() if name.endswith("/data.pkl")]
            if len(names) != 1:
                return None  # not torch.save's layout: torch.load refuses it as not plain data
            size = archive.getinfo(names[0]).file_size
            if size > MAX_PLAIN_BYTES:
                return (f"the result's numbers, strings and containers take {size / 2**20:.1f} MiB, more than the "
                        f"{MAX_PLAIN_BYTES / 2**20:g} MiB a check accepts (put large data in tensors)")
            pickle = archive.read(names[0])
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return None  # torch.load refuses it as not plain data
    count = 0
    try:
        for _ in pickletools.genops(pickle):
            count += 1
            if count > MAX_PLAIN_ITEMS:
                return (f"the result holds more than {MAX_PLAIN_ITEMS:,} numbers, strings and containers, "
                        "more than a check accepts (put large data in tensors)")
    except (ValueError, EOFError):
        return None  # not a whole pickle: torch.load refuses it as not plain data
    return None


def too_large(limit: int) -> str:
    """Why a judged result was refused: the one message, whichever side refuses it."""
    return f"the rank's result is larger than the {limit / 2**20:g} MiB a check accepts"


def _claimed_bytes(result) -> int:
    """The bytes the result's tensors claim by their shapes (numel x element size)."""
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors_in(result))


def tensors_in(result) -> list:
    """Every tensor in a result of plain data (nested lists, tuples, sets, dict keys and values), each once."""
    import torch

    found, seen, todo = [], set(), [result]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, dict):
            todo += list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            todo += list(item)
    return found
