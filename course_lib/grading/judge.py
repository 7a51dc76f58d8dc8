"""The judge and the learner side: no code of a learner runs where a verdict is decided.

Introduced with the graded exercises (chapter 01 on), used by every exercise notebook::

    learner = Learner(answers=("all_reduce_via_send_recv",))      # in the setup cell
    ...
    results = learner.launch(run_answer, world_size=4, args=(shape, seed))   # in a check cell
    value = learner.call(make_plan, budget)                                   # one process, no group

Two sides:

* The **judge** is the process that runs the check cells: the notebook's kernel. It holds the
  checks, the references and the hidden inputs, and it never runs a learner's cell. When
  ``scripts/grade.py`` grades, the kernel nbval talks to is a judge in this strict sense: the
  answer cells of the merged notebook are handed to ``answer_cell`` as text and never executed
  in it; the kernel turns itself non-dumpable (other processes of the same user cannot read its
  memory, environment or files), and its hidden seed is read from a file that is deleted at once.
* The **learner side** is a fresh worker process per call: forked from the launch server (a
  clean interpreter that never ran a check), it runs the setup cell and the learner's answer
  cells (as text), then the check's worker function, and returns its result as **data only**
  (``torch.save`` bytes that the judge loads with ``weights_only=True``: tensors, numbers,
  strings and containers; never an object of the learner's making). While a rank waits to be
  released, the judge reads what the operating system counted for it (bytes it sent, its peak
  memory), which code inside the rank cannot change.

In JupyterLab the same code runs: the kernel records the source of each answer cell as the
learner runs it, and every check sends those sources (not the kernel's state) to fresh
workers, so a check cell gives the verdict the grader will give.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import sys

from .. import launcher
from . import proof
from .dumpable import make_non_dumpable

__all__ = ["Learner", "AnswerRef", "hidden_seed", "become_judge", "record_cells", "answer_cell", "next_submission",
           "in_grading"]

_SEED_FILE_VARIABLE = "COURSE_GRADING_SEED_FILE"
_GRADING_VARIABLE = "COURSE_GRADING"
_SANDBOX_VARIABLE = "COURSE_GRADING_SANDBOX"  # "1": every submission in a sandbox of its own; "0": unconfined
_state = {"grading": None, "secret": None, "learner": None, "namespace": None, "sandboxed": False}
# What the learner side sees of the judge's environment: what torch, OpenMP, the launcher and the
# course read, never the rest (an instructor's tokens, the grader's own variables).
_PASSED_VARIABLES = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "CUDA_VISIBLE_DEVICES",
                     "COURSE_CPUS", "COURSE_START_METHOD")
_PASSED_PREFIXES = ("LC_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH_", "GLOO_", "NCCL_", "ATEN_")


# --------------------------------------------------------------------------
# The judge's own process
# --------------------------------------------------------------------------
def become_judge() -> None:
    """Called by the grader first thing in the kernel it grades with (see scripts/grade.py)."""
    make_non_dumpable()
    path = os.environ.pop(_SEED_FILE_VARIABLE, None)
    os.environ.pop(_GRADING_VARIABLE, None)
    _state["sandboxed"] = os.environ.pop(_SANDBOX_VARIABLE, "1") != "0"
    _state["grading"] = True
    if path:
        with open(path, encoding="utf-8") as f:
            _state["secret"] = f.read().strip()
        os.remove(path)


def record_cells(path: str) -> None:
    """After every cell this kernel runs, write one sealed line to ``path``: which cell ran, and the
    exception it ended with (type and message) or none. The grader scores from these lines, not from
    what reached nbval (course_lib.grading.proof), and quotes the message without the traceback."""
    secret = _state["secret"]
    if not secret:
        raise RuntimeError("the judge has no secret to seal its records with (become_judge read no seed file)")
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("record_cells runs in the judge's kernel")

    def remember(result):
        error = result.error_before_exec or result.error_in_exec
        ename = None if error is None else type(error).__name__
        try:
            message = None if error is None else str(error)
        except Exception:  # noqa: BLE001 - an exception whose __str__ raises is still an error
            message = "(the exception's message could not be read)"
        cell = proof.cell_key(result.info.raw_cell)
        entry = {"cell": cell, "ename": ename, "evalue": message, "seal": proof.seal(secret, cell, ename)}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    shell.events.register("post_run_cell", remember)


def in_grading() -> bool:
    if _state["grading"] is None:
        _state["grading"] = os.environ.get(_GRADING_VARIABLE) == "1"
    return bool(_state["grading"])


def hidden_seed(label: str) -> int:
    """A seed for a hidden case: drawn per grading run from the grader's secret, fixed otherwise."""
    secret = _state["secret"] if in_grading() and _state["secret"] else "course"
    return int(hashlib.sha256(f"{secret}:{label}".encode()).hexdigest()[:8], 16)


# --------------------------------------------------------------------------
# Answers: names the judge refers to, resolved only on the learner side
# --------------------------------------------------------------------------
def _resolve_answer(name: str):
    main = sys.modules.get("__main__")
    if main is None or not hasattr(main, name):
        raise NameError(f"name {name!r} is not defined: the answer cell that should define it did not "
                        "(run it, and keep its name)")
    return getattr(main, name)


class AnswerRef:
    """Stands for the learner's ``name`` in the judge; becomes the real object in a worker."""

    def __init__(self, name: str):
        self.name = name

    def __reduce__(self):
        return _resolve_answer, (self.name,)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.name} is the learner's code and runs only on the learner side: "
                        f"use learner.call({self.name}, ...) or learner.launch(...)")

    def __repr__(self) -> str:
        return f"<the learner's {self.name}>"


class _AnswerPickler(launcher.CodeFilePickler):
    """cloudpickle (keeping code file names), except that the learner's answers travel by name, never by value."""

    def __init__(self, file, answers: dict[int, str]):
        super().__init__(file)
        self._answers = answers

    def reducer_override(self, obj):
        name = self._answers.get(id(obj))
        if name is not None:
            return _resolve_answer, (name,)
        return super().reducer_override(obj)


def _top_level_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def _calling_cell_source(depth: int = 2) -> str:
    """The source of the notebook cell (or script) that is running the caller's caller."""
    import linecache

    frame = sys._getframe(depth)
    while frame is not None and frame.f_globals.get("__name__") != "__main__":
        frame = frame.f_back
    if frame is None:
        return ""
    return "".join(linecache.getlines(frame.f_code.co_filename))


def _learner_environment() -> dict:
    return {name: value for name, value in os.environ.items()
            if name in _PASSED_VARIABLES or name.startswith(_PASSED_PREFIXES)}


def _unprivileged_user():
    """(uid, gid) of 'nobody' when the grader runs as root, else None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd
    import stat

    # Only if that user can run this Python and course_lib (e.g. not a pyenv under /root).
    for path in {sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}:
        parts = os.path.abspath(path).split(os.sep)
        for depth in range(1, len(parts) + 1):
            directory = os.sep.join(parts[:depth]) or os.sep
            with contextlib.suppress(OSError):
                if not os.stat(directory).st_mode & stat.S_IXOTH:
                    return None

    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    return None


class Learner:
    """The learner side of one exercise notebook (see the module docstring).

    answers: the names the answer cells define (functions or classes) that checks use.
    setup: the setup cell's source (default: the cell that creates this object).
    """

    def __init__(self, answers, setup: str | None = None):
        self.answers = tuple(answers)
        self.inert = os.environ.get("COURSE_LEARNER_SIDE") == "1"  # the setup cell, run in a worker
        if self.inert:
            return
        self.setup = _calling_cell_source() if setup is None else setup
        self.grading = in_grading()
        self.cells: dict[str, str] = {}  # label -> source, in the order they first ran
        self.broken: dict[str, str] = {}  # label -> why the cell is replaced (grading)
        self.shell = None
        with contextlib.suppress(Exception):
            from IPython import get_ipython

            self.shell = get_ipython()
        if self.grading:
            if self.shell is not None:
                for name in self.answers:
                    self.shell.user_ns[name] = AnswerRef(name)
        elif self.shell is not None:
            self.shell.events.register("post_run_cell", self._record)
        _state["learner"] = self

    # ----- which cells the learner side runs
    def _record(self, result) -> None:
        source = getattr(result.info, "raw_cell", "") or ""
        defined = [name for name in self.answers if name in _top_level_names(source)]
        if defined:
            self.cells[f"answer cell defining {', '.join(defined)}"] = source

    def record(self, label: str, source: str) -> None:
        """Hand an answer cell's source to the learner side (outside a notebook, or by the grader)."""
        self.cells[label] = source

    def prelude(self) -> list[tuple[str, str]]:
        cells = [(label, self.broken.get(label, source)) for label, source in self.cells.items()]
        return [("setup cell", self.setup)] + cells

    # ----- running the learner's code
    def launch(self, fn, world_size: int, args=(), kwargs=None, *, rank_args=None, timeout: float = 30,
               measure: bool = False, startup_timeout: float = 60, init_process_group: bool = True,
               show_output: bool = False, shared=(), memory_limit: int | None = None):
        """Run the check's ``fn(*args, *rank_args[rank])`` on ``world_size`` fresh ranks that hold the
        learner's cells.

        ``rank_args``: one tuple per rank, sent to that rank only (each rank's own input: no rank
        ever holds another's data, so it must communicate to learn it).
        ``shared``: folders every rank may write (a checkpoint folder under ``scratch``). Graded in a
        sandbox, no other file is shared: each rank writes only to a folder of its own (its working
        directory), and cannot reach another rank's files or memory (course_lib.confine.apart).
        Returns the ranks' results (data only), and with measure=True also, per rank,
        ``{"sent_bytes", "written_bytes", "peak_rss_bytes", "start_rss_bytes", "network_bytes", "sent_to", "sent_to_others"}`` as the operating
        system counted them (None off Linux). ``sent_bytes`` is what reached the other ranks over TCP
        (``sent_to`` summed over the other ranks: rank 0's own client talking to the TCPStore it hosts is
        not sent), or, where the socket table cannot be read outside a sandbox, what the rank wrote;
        ``written_bytes`` is what the rank wrote, to sockets and files alike (who wrote a checkpoint);
        ``network_bytes``, graded in a sandbox only (else None), is what crossed the sandbox's loopback during
        the launch, all ranks together: a lower bound on communication belongs on it, as a rank can add to
        its writes with files. ``sent_to[j]``: the bytes that reached rank j over TCP connections this rank
        holds the other end of, and ``sent_to_others`` those that reached ends no rank holds (a helper's),
        read from the kernel's socket table (course_lib.confine.tcp_flows): what a communication pattern
        leaves behind, whatever code in the rank says it ran.
        ``memory_limit``: bytes a rank's memory may grow from its start, counted as ``peak_rss_bytes``
        counts it (its helpers and files included), read from outside every 10 ms. Past them, every rank
        is stopped at once and ``MemoryLimitExceeded`` (course_lib.launcher) is raised: a run that holds
        too much fails as soon as it does, not later or by a cell's timeout, however slow the rest of it
        would have been.
        """
        if self.inert:
            raise RuntimeError("learner.launch runs in the judge, not on the learner side")
        kwargs = {} if kwargs is None else kwargs
        if rank_args is not None and len(rank_args) != world_size:
            raise ValueError(f"rank_args has {len(rank_args)} entries for {world_size} ranks")
        judged = launcher._Judged(prelude=self.prelude(), counts_bytes=measure, memory_limit=memory_limit)
        if self.grading and _state["sandboxed"]:
            judged.sandbox = self.sandbox()
            judged.environment = _learner_environment()
            judged.cwd = str(judged.sandbox.scratch)
            judged.apart = {"shared": [os.fspath(folder) for folder in shared], "readable": [judged.cwd],
                            "private_root": judged.sandbox.private_folders[0]}  # its /tmp: a tmpfs of its own
        elif self.grading:
            judged.run_as = _unprivileged_user()
        judged.payloads = [self._payload(fn, tuple(args) + tuple(rank_args[rank] if rank_args else ()), kwargs)
                           for rank in range(world_size)]
        results, measured = launcher._launch(
            fn, world_size, args, kwargs, timeout=timeout, backend="auto", init_process_group=init_process_group,
            start_method=None, threads=None, show_output=show_output, live=True,
            startup_timeout=startup_timeout, judged=judged)
        return (results, measured) if measure else results

    def reference_flows(self, fn, world_size: int, rank_args, timeout: float = 30) -> list[list[int]]:
        """``sent_to`` of every rank (see launch) when the check's own ``fn`` runs: the pattern an
        exercise asks for, as this machine's backend carries it out (which tree a broadcast takes is
        the backend's choice). Measured once per function and shapes (see _judge_side_run)."""
        key = (fn.__name__, world_size, _shapes(rank_args))
        cache = self.__dict__.setdefault("_reference_flows", {})
        if key not in cache:
            measured = _judge_side_run(fn, [tuple(args) for args in rank_args], counts_bytes=True, timeout=timeout)
            cache[key] = [m["sent_to"] for m in measured]
        return cache[key]

    def reference_growth(self, fn, world_size: int, args=(), timeout: float = 60) -> list[int]:
        """How much each rank's resident memory grew, from before any code of the check ran to its
        peak, when the check's own ``fn(*args)`` runs: what a memory rule compares an answer's growth
        with, measured as launch measures the learner's (see _judge_side_run)."""
        measured = _judge_side_run(fn, [tuple(args)] * world_size, counts_bytes=False, timeout=timeout)
        return [m["peak_rss_bytes"] - m["start_rss_bytes"] for m in measured]

    def sandbox(self):
        """This submission's sandbox (grading): made at its first launch, ended by next_submission."""
        from .sandbox import Sandbox

        if getattr(self, "_sandbox", None) is None:
            self._sandbox = Sandbox()
        return self._sandbox

    def start_sandbox(self) -> None:
        """Make this submission's sandbox and start its launch server (it imports torch) now."""
        if self.grading and _state["sandboxed"]:
            launcher._sandbox_context(self.sandbox())

    def empty_sandbox(self) -> bool:
        """Empty this submission's sandbox for the next one (Sandbox.empty_for_the_next_submission);
        False where there is none, or it cannot be reused."""
        box = getattr(self, "_sandbox", None)
        return box is not None and box.empty_for_the_next_submission()

    def end_sandbox(self) -> None:
        box = getattr(self, "_sandbox", None)
        if box is not None:
            box.close()
            self._sandbox = None

    @property
    def scratch(self) -> str:
        """A folder the learner side can write in and the judge can read (a check's files go here)."""
        if self.grading and _state["sandboxed"]:
            return str(self.sandbox().scratch)
        import tempfile

        return tempfile.gettempdir()

    def call(self, fn, *args, timeout: float = 60, **kwargs):
        """Run the check's ``fn(*args, **kwargs)`` in one fresh learner-side process; return its data."""
        return self.launch(fn, 1, args, kwargs, timeout=timeout, init_process_group=False)[0]

    def _payload(self, fn, args, kwargs) -> bytes:
        answers = {}
        if self.shell is not None:
            for name in self.answers:
                value = self.shell.user_ns.get(name)
                if value is not None and not isinstance(value, AnswerRef):
                    answers[id(value)] = name
        buffer = io.BytesIO()
        try:
            _AnswerPickler(buffer, answers).dump((fn, tuple(args), kwargs))
        except Exception as exc:  # noqa: BLE001
            raise TypeError(f"the check's function or arguments cannot be sent to the learner side "
                            f"({type(exc).__name__}: {exc})") from None
        return buffer.getvalue()


def _judge_side_run(fn, rank_args: list[tuple], counts_bytes: bool, timeout: float) -> list[dict]:
    """The check's own ``fn(*rank_args[rank])``, measured from outside as a learner's launch is: on
    fresh ranks that hold none of the learner's cells, started by the judge itself, never in the
    learner's sandbox. Each rank's measurements (see Learner.launch)."""
    judged = launcher._Judged(prelude=[], counts_bytes=counts_bytes)
    judged.payloads = [launcher._serialise_call(fn, args, {}) for args in rank_args]
    _, measured = launcher._launch(
        fn, len(rank_args), (), {}, timeout=timeout, backend="auto", init_process_group=True, start_method=None,
        threads=None, show_output=False, live=True, startup_timeout=60, judged=judged)
    return measured


def _shapes(value):
    """The shapes and dtypes of the tensors in ``value`` (nested tuples and lists), for a cache key."""
    if isinstance(value, (list, tuple)):
        return tuple(_shapes(item) for item in value)
    shape = getattr(value, "shape", None)
    return (tuple(shape), str(value.dtype)) if shape is not None else repr(value)


def answer_cell(label: str, source: str, timeout: float | None = None) -> None:
    """The grader's stand-in for an answer cell: record its text, and try it once on the learner side.

    The judge never executes the text itself. An answer cell that raises fails here (the
    grader notes it); one that does not finish within ``timeout`` (default: half the grader's
    cell timeout) is replaced, for every later check, by a cell that says so, so it costs
    one timeout and not one per check.
    """
    learner = _state["learner"]
    if learner is None:
        raise RuntimeError("the notebook's setup cell did not create its Learner")
    if timeout is None:
        timeout = max(2.0, min(60.0, float(os.environ.get("COURSE_GRADER_CELL_TIMEOUT", "120")) / 2))
    learner.record(label, source)
    why = f"this answer cell did not finish within {timeout:g} s (an endless loop at the top level?)"
    try:
        errors = learner.launch(_cell_errors, 1, timeout=timeout, startup_timeout=timeout,
                                init_process_group=False)[0]
    except launcher.WorkerTimeout:
        learner.broken[label] = ""  # later checks run without it (its names stay undefined)
        raise RuntimeError(why) from None
    except launcher.WorkerError as exc:
        raise RuntimeError(f"{exc.exc_type}: {exc.message}") from None
    except BaseException:  # interrupted by the grader's cell timeout: the same verdict
        learner.broken[label] = ""
        raise
    for cell, exc_type, message in errors if isinstance(errors, list) else []:
        if cell == label:
            raise RuntimeError(f"{exc_type}: {message}")


def next_submission() -> None:
    """The grader's marker between two submissions that one judge grades in turn.

    Forgets the previous submission's answer cells, and restores the judge's globals to what
    the setup left (names the check cells bound are removed, rebound names restored), so no
    value a check computed for one submission can reach the next one's checks.
    """
    learner = _state["learner"]
    if learner is None:
        raise RuntimeError("the notebook's setup cell did not create its Learner")
    learner.cells.clear()
    learner.broken.clear()
    if not learner.empty_sandbox():  # nothing the last submission started survives into the next one's checks
        learner.end_sandbox()
        learner.start_sandbox()  # here, in the grader's own cell: an answer cell's time is the answer's alone
    if learner.shell is None:
        return
    namespace = learner.shell.user_ns
    kept = _state["namespace"]
    if kept is None:  # the first submission: remember what the setup defined
        _state["namespace"] = {name: value for name, value in namespace.items() if not name.startswith("_")}
        return
    for name in [name for name in namespace if not name.startswith("_")]:
        if name not in kept:
            del namespace[name]
        elif namespace[name] is not kept[name]:
            namespace[name] = kept[name]
    for name, value in kept.items():
        namespace.setdefault(name, value)


def _cell_errors():
    return [list(map(str, error)) for error in launcher.PRELUDE_ERRORS]


