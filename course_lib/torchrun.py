"""Run ``torchrun`` from a notebook, with the promises ``launch`` keeps (chapter 04).

``run_torchrun(fn, nproc_per_node=2)`` writes ``fn`` out as a script
(``course_lib.torchrun_script``), runs ``python -m torch.distributed.run --standalone ...``
(that is ``torchrun``) as a subprocess and returns each rank's return value in rank order.
Each rank's output is printed afterwards, prefixed ``[rank r]``, in rank order (and per
restart attempt when torchrun restarted the workers). ``run_agents`` starts several torchrun
agents at once (two "nodes" on one machine); ``Nodes`` starts them one at a time, while the job
runs (elastic membership).

Promises: every agent has a timeout; on a failure, a timeout or an interrupt every agent and
every worker it started is stopped (SIGTERM, then SIGKILL); an agent dies with the notebook
(Linux ``PR_SET_PDEATHSIG``); ports come from ``--standalone`` or ``free_port()``, never 29500.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import torch

from .launcher.live import StatusLine
from .torchrun_script import write_torchrun_script

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # what the `torchrun` command runs


class TorchrunError(RuntimeError):
    """An agent exited with an error; ``str()`` holds the agents' and failing workers' last lines."""

    def __init__(self, message: str, returncodes: list[int | None], logs: list[str]):
        self.returncodes, self.logs = returncodes, logs
        super().__init__(message)


class TorchrunTimeout(TorchrunError):
    """The agents did not finish in time; all of them and their workers were stopped."""


def free_port() -> int:
    """A port that is free now (the OS picks it); for a rendezvous endpoint on this machine.

    Free on every address (the wildcard), as the store that will listen there binds it."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Agent:
    """One ``torchrun`` process (a "node") and the file its log goes to."""

    command: list[str]
    log_path: Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    ended: float | None = None
    kept_text: str | None = None  # the log, read before its folder is removed

    def start(self, env: dict[str, str], cwd: Path) -> None:
        self.log = open(self.log_path, "wb")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.command, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
            start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.ended is None:
            self.ended = time.monotonic()
        return code

    def text(self) -> str:
        if self.kept_text is not None:
            return self.kept_text
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""


def _clean_up(agents: list[Agent], folder: Path) -> None:
    """Once every agent and worker has stopped: keep the agents' logs in memory, remove the run's folder."""
    for agent in agents:
        agent.kept_text = agent.text()
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class TorchrunRun:
    """What a finished run left: results by rank, output per (attempt, rank), the agents' logs."""

    results: list
    outputs: dict[tuple[int, int], tuple[str, str]] = field(default_factory=dict)
    agent_logs: list[str] = field(default_factory=list)
    returncodes: list[int | None] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def attempts(self) -> list[int]:
        return sorted({attempt for attempt, _ in self.outputs})


def _stop(agents: list[Agent], folder: Path, grace_s: float = 3.0) -> None:
    """SIGTERM each agent (torchrun then stops its workers), then SIGKILL whatever is left."""
    family: list[psutil.Process] = []
    for agent in agents:
        if agent.process is None:
            continue
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(agent.process.pid)
            family += [parent, *parent.children(recursive=True)]
    # workers that outlived their agent (reparented) left their pid in the output folder
    for note in folder.glob("pid.*"):
        with contextlib.suppress(psutil.Error, ValueError, OSError):
            proc = psutil.Process(int(note.name.split(".")[1]))
            if any(note.read_text() in part for part in proc.cmdline()):
                family.append(proc)
    for agent in agents:
        if agent.process is not None and agent.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                agent.process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=5)
    for agent in agents:
        if agent.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.process.wait(timeout=5)
            agent.poll()
            agent.log.close()


_LOG_NOISE = re.compile(r"^[WIE]\d{4} [\d:.]+ \d+ \S+\] ")


def clean_log(text: str) -> str:
    """torchrun's log lines without their timestamp/pid prefix."""
    return "\n".join(_LOG_NOISE.sub("", line) for line in text.splitlines())


def _collect(folder: Path, world_hint: int) -> tuple[list, dict]:
    outputs: dict[tuple[int, int], tuple[str, str]] = {}
    for path in folder.glob("rank*.attempt*.out"):
        rank, attempt = (int(x) for x in re.findall(r"\d+", path.name)[:2])
        err = path.with_suffix(".err")
        outputs[(attempt, rank)] = (path.read_text(errors="replace"),
                                    err.read_text(errors="replace") if err.exists() else "")
    ranks = sorted(int(re.findall(r"\d+", p.name)[0]) for p in folder.glob("result*.pt"))
    size = max([world_hint, *(r + 1 for r in ranks)]) if ranks else 0
    results = [None] * size
    for rank in ranks:
        results[rank] = torch.load(folder / f"result{rank}.pt", weights_only=False)
    return results, outputs


def print_outputs(outputs: dict[tuple[int, int], tuple[str, str]], stderr: bool = True) -> None:
    """Each rank's stdout then stderr, prefixed by rank, in rank order, attempt by attempt.

    ``stderr=False`` leaves out the ranks' stderr (e.g. the errors of a group torchrun restarted).
    """
    attempts = sorted({attempt for attempt, _ in outputs})
    for attempt in attempts:
        if len(attempts) > 1:
            print(f"--- attempt {attempt} (TORCHELASTIC_RESTART_COUNT={attempt}) ---")
        for (_, rank), (out, err) in sorted((k, v) for k, v in outputs.items() if k[0] == attempt):
            for line in out.splitlines():
                print(f"[rank {rank}] {line}")
            for line in err.splitlines() if stderr else ():
                print(f"[rank {rank}] {line}", file=sys.stderr)


def _failure_text(agents: list[Agent], outputs, shown: bool, tail: int = 15) -> str:
    parts = []
    for index, agent in enumerate(agents):
        lines = [line for line in clean_log(agent.text()).splitlines() if line.strip()]
        parts.append(f"--- agent {index} (exit code {agent.process.returncode}), last lines of its log:\n"
                     + "\n".join(lines[-tail:]))
    for (attempt, rank), (_, err) in sorted(outputs.items()):
        if "Traceback" in err and not shown:  # already printed with the ranks' output
            parts.append(f"--- rank {rank} (attempt {attempt}) stderr:\n" + "\n".join(err.splitlines()[-tail:]))
    return "\n".join(parts)


def _agent_env(env: dict[str, str | None] | None, folder: Path) -> dict[str, str]:
    """The notebook's environment, ``env`` on top (None unsets), and its import path for the workers.

    Their TMPDIR is a folder inside the run's, removed with it: torchrun makes a log folder there
    (``torchelastic_...``) on every start and never removes it."""
    private_tmp = folder / "tmp"
    private_tmp.mkdir(exist_ok=True)
    run_env = {**os.environ, "TMPDIR": str(private_tmp), **(env or {}), "COURSE_TORCHRUN_OUTPUT": str(folder)}
    run_env = {key: value for key, value in run_env.items() if value is not None}
    run_env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(
        [os.getcwd(), *[p for p in sys.path if p], *run_env.get("PYTHONPATH", "").split(os.pathsep)]))
    return run_env


def run_agents(script: str | Path, agent_options: list[list[str]], *, script_args=(), timeout: float = 120,
               env: dict[str, str] | None = None, show_output: bool = True, check: bool = True,
               stagger_s: float = 0.0, on_started=None) -> TorchrunRun:
    """Start one torchrun agent per entry of ``agent_options`` on ``script``; wait for all of them.

    ``env``: variables to set for the agents (a value of None unsets the variable).
    ``agent_options``: each agent's torchrun options, e.g. ``["--standalone", "--nproc-per-node=2"]``.
    ``stagger_s`` waits between starting agents. ``on_started(agents, folder)`` runs once all are started
    (to kill a worker, for example) and may return while they run. Raises ``TorchrunTimeout`` after
    ``timeout`` seconds and, with ``check``, ``TorchrunError`` when an agent fails; in every case
    every agent and worker has been stopped when this returns.
    """
    script = Path(script).resolve()
    folder = Path(tempfile.mkdtemp(prefix="torchrun-"))
    run_env = _agent_env(env, folder)
    agents = [Agent([*TORCHRUN, *options, str(script), *map(str, script_args)], folder / f"agent{i}.log")
              for i, options in enumerate(agent_options)]
    deadline = time.monotonic() + timeout
    finished = False
    status = StatusLine(f"torchrun: {len(agents)} agent{'s' if len(agents) > 1 else ''}")
    try:
        for index, agent in enumerate(agents):
            if index and stagger_s:
                time.sleep(stagger_s)
            agent.start(run_env, cwd=script.parent)
        if on_started is not None:
            on_started(agents, folder)
        while any(agent.poll() is None for agent in agents):
            failed = [a for a in agents if a.poll() not in (None, 0)]
            if failed and check:
                break  # one agent failed: the others would only wait for it
            if time.monotonic() > deadline:
                raise TorchrunTimeout(f"torchrun did not finish within {timeout} s; every agent and worker "
                                      "was stopped", [a.process.returncode for a in agents],
                                      [a.text() for a in agents])
            status.show(f"{sum(agent.poll() is None for agent in agents)} running")
            time.sleep(0.05)
        finished = True
    finally:
        status.close()
        _stop(agents, folder)  # also on an exception or KeyboardInterrupt
        results, outputs = _collect(folder, 0)
        _clean_up(agents, folder)  # everything needed has been read
        if show_output:
            print_outputs(outputs)
    run = TorchrunRun(results, outputs, [a.text() for a in agents], [a.process.returncode for a in agents],
                      [(a.ended or time.monotonic()) - a.started for a in agents])
    if check and finished and any(code != 0 for code in run.returncodes):
        raise TorchrunError("torchrun failed:\n" + _failure_text(agents, outputs, show_output), run.returncodes, run.agent_logs)
    return run


class Nodes:
    """torchrun agents ("nodes") started one at a time on one script: elastic membership (chapter 04).

        with Nodes(script, options, timeout=240) as nodes:
            nodes.start("A"); nodes.start("B")
            nodes.wait_until(lambda: ..., "the job to shrink")   # raises TorchrunTimeout when late
            nodes.start("C")                                     # a node joins

    ``timeout`` bounds the whole block. Leaving it, normally or by an exception or interrupt, stops
    every agent and every worker, including workers whose agent was killed (they are reparented).
    """

    def __init__(self, script: str | Path, options: list[str], *, script_args=(), timeout: float = 240,
                 env: dict[str, str | None] | None = None):
        self.script = Path(script).resolve()
        self.options = list(options)
        self.script_and_args = [str(self.script), *map(str, script_args)]
        self.folder = Path(tempfile.mkdtemp(prefix="torchrun-nodes-"))
        self.env = _agent_env(env, self.folder)
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.agents: dict[str, Agent] = {}

    def __enter__(self) -> "Nodes":
        return self

    def __exit__(self, *exc) -> None:
        _stop(list(self.agents.values()), self.folder)
        _clean_up(list(self.agents.values()), self.folder)  # read results inside the block

    def start(self, name: str, env: dict[str, str] | None = None, options=()) -> Agent:
        """Start one more agent (a node joining the job); ``env`` and ``options``: for this node only."""
        command = [*TORCHRUN, *self.options, *map(str, options), *self.script_and_args]
        agent = Agent(command, self.folder / f"agent-{name}.log")
        agent.start({**self.env, **(env or {})}, cwd=self.script.parent)
        self.agents[name] = agent
        return agent

    def name_of(self, agent_pid: int) -> str:
        """The node whose agent has this process id (a worker's ``os.getppid()``)."""
        return next(name for name, agent in self.agents.items() if agent.process.pid == agent_pid)

    def wait_until(self, condition, what: str, poll_s: float = 0.05) -> None:
        """Poll ``condition()`` until it is true; past the block's deadline raise ``TorchrunTimeout``."""
        with StatusLine(f"waiting for {what}") as status:
            self._poll(condition, what, poll_s, status)

    def _poll(self, condition, what, poll_s, status) -> None:
        while not condition():
            status.show(", ".join(f"node {name} {'running' if code is None else f'exited {code}'}"
                                  for name, code in self.returncodes().items()))
            if time.monotonic() > self.deadline:
                logs = [agent.text() for agent in self.agents.values()]
                tails = "\n".join(f"--- node {name}, last lines of its log:\n"
                                  + "\n".join(clean_log(agent.text()).splitlines()[-8:])
                                  for name, agent in self.agents.items())
                raise TorchrunTimeout(f"waited {self.timeout} s in all for {what}; every agent and worker "
                                      f"is being stopped\n{tails}", self.returncodes(), logs)
            time.sleep(poll_s)

    def returncodes(self) -> dict[str, int | None]:
        return {name: agent.poll() for name, agent in self.agents.items()}

    def results(self) -> list:
        """The return values the workers of the last group saved, by rank (None where none yet)."""
        return _collect(self.folder, 0)[0]


def run_torchrun(fn, nproc_per_node: int = 2, args=(), *, options=("--standalone",), timeout: float = 120,
                 env: dict[str, str] | None = None, show_output: bool = True, script: str | Path | None = None):
    """Write ``fn`` to a script and run it under ``torchrun --standalone``; return the ranks' results."""
    folder = Path(tempfile.mkdtemp(prefix="torchrun-script-"))
    try:
        path = write_torchrun_script(fn, script or folder / f"{fn.__name__}.py", args=args)
        run = run_agents(path, [[*options, f"--nproc-per-node={nproc_per_node}"]], timeout=timeout, env=env,
                         show_output=show_output)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return run.results


def accepts_connections(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port`` (a rendezvous store, for example)."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def command_line(options, script="train.py") -> str:
    """How a learner would type it in a terminal."""
    return shlex.join(["torchrun", *options, str(script)])


def run_command(argv: list[str], timeout: float = 120, env: dict[str, str] | None = None,
                cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run a command (a launcher, a script) with a timeout; on timeout or interrupt stop it and its children.

    Its TMPDIR is a folder of its own, removed when it returns (torchrun and the legacy launcher leave a
    log folder there on every start); ``env`` may set another, for a command whose work outlives it (sbatch).
    """
    with tempfile.TemporaryDirectory(prefix="course-command-", ignore_cleanup_errors=True) as private_tmp:
        run_env = {**os.environ, "TMPDIR": private_tmp, **(env or {})}
        run_env = {key: value for key, value in run_env.items() if value is not None}
        return _run_with_timeout(argv, timeout, run_env, cwd)


def _run_with_timeout(argv, timeout, run_env, cwd) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env, cwd=cwd,
                            start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    deadline = time.monotonic() + timeout
    try:
        with StatusLine(f"{Path(argv[0]).name} is running") as status:
            while True:  # communicate may be called again after a TimeoutExpired: nothing is lost
                try:
                    out, err = proc.communicate(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= deadline:
                        raise subprocess.TimeoutExpired(argv, timeout) from None
                    status.show()
    except BaseException:
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
            for member in family:
                with contextlib.suppress(psutil.Error):
                    member.terminate()
            _, alive = psutil.wait_procs(family, timeout=5)
            for member in alive:
                with contextlib.suppress(psutil.Error):
                    member.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
