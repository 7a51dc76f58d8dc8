"""Memory of a learner with many notebooks open: one launch server per kernel against one per user.

    sudo .venv/bin/python scripts/bench_launch_servers.py [--notebooks 8] [--ranks 4] [--limit 4G] [--only shared]

Starts NOTEBOOKS Jupyter kernels (ipykernel, as JupyterLab does) in a memory cgroup of their own, as
the class hub holds a learner (jupyter/hub_spawner.py). Each kernel imports torch and course_lib as a
lesson does, then all launch RANKS ranks at the same moment, each rank holding a small tensor. Done
twice: with a launch server per kernel (each kernel given a runtime folder of its own, so none finds
another's server), and with the user's one shared server (course_lib/launcher/shared_server.py).
Prints, for each, the cgroup's memory with the kernels idle, its peak during the launches, whether
every launch succeeded and whether the kernel's OOM killer struck, then the ratio of the peaks.
With --limit the cgroup is held to that much memory (no swap), as the hub holds a learner; the exit
status is 1 if a launch failed or anything was killed. Needs root and a writable memory cgroup.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from course_lib.confine.cgroups import Cgroups, cgroup_roots  # noqa: E402
from course_lib.hardware import hardware_line  # noqa: E402

IMPORTS = "import torch\nimport course_lib\nfrom course_lib import launch\n"
LAUNCH = """
def holds_a_little(n):
    import torch
    return float(torch.ones(n).sum())

print(json.dumps(launch(holds_a_little, {ranks}, args=(1 << 20,), init_process_group=False, show_output=False,
                        timeout=600)))
"""


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().rstrip("B").rstrip("I")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def _memory(group: Cgroups, peak: bool) -> int:
    folder = group.dirs[0] if group.v2 else group.dirs[1]
    name = ("memory.peak" if peak else "memory.current") if group.v2 else \
        ("memory.max_usage_in_bytes" if peak else "memory.usage_in_bytes")
    return int((folder / name).read_text())


def _reset_peak(group: Cgroups) -> None:
    if not group.v2:
        (group.dirs[1] / "memory.max_usage_in_bytes").write_text("0")


def _kernel_spec(folder: Path, group: Cgroups) -> Path:
    """A kernel spec whose kernel joins ``group`` before it starts (the hub's learners are in theirs)."""
    spec = folder / "kernels" / "in-cgroup"
    spec.mkdir(parents=True)
    join = group.join_command().replace("\n", "; ")
    argv = ["sh", "-c", f"{join} exec {shlex.quote(sys.executable)} -m ipykernel_launcher -f \"$0\"",
            "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "in a cgroup", "language": "python"}))
    return folder


def _run_all(clients, code: str, timeout: float) -> list[tuple[str, str | None]]:
    """Send ``code`` to every kernel at once; each one's output and error."""
    sent = [client.execute(code) for client in clients]
    results = []
    for client, msg_id in zip(clients, sent):
        text, error, deadline = [], None, time.monotonic() + timeout
        while True:
            message = client.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                break
        results.append(("".join(text), error))
    return results


def measure(mode: str, notebooks: int, ranks: int, limit: int) -> dict:
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    roots = cgroup_roots()
    group = Cgroups(roots, f"course-bench-{uuid.uuid4().hex[:8]}", limit, 4096)
    managers, clients = [], []
    with tempfile.TemporaryDirectory(prefix="bench-launch-servers-") as root:
        folder = _kernel_spec(Path(root) / "jupyter", group)
        try:
            for index in range(notebooks):
                runtime = Path(root) / ("runtime" if mode == "shared" else f"runtime-{index}")
                runtime.mkdir(mode=0o700, exist_ok=True)
                env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "COURSE_CPUS": str(os.cpu_count())}
                env.pop("COURSE_START_METHOD", None)
                specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
                manager = KernelManager(kernel_name="in-cgroup", kernel_spec_manager=specs, transport="ipc",
                                        ip=str(Path(root) / f"kernel-{index}"))  # local sockets, as the hub's
                manager.start_kernel(env=env, cwd=root)
                client = manager.client()
                client.start_channels()
                client.wait_for_ready(timeout=300)
                managers.append(manager)
                clients.append(client)
            imported = _run_all(clients, IMPORTS + "import json\n", 600)
            time.sleep(5)  # each kernel's own launch server (where it has one) starts as the kernel does
            idle = _memory(group, peak=False)
            _reset_peak(group)
            launched = _run_all(clients, LAUNCH.format(ranks=ranks), 900)
            peak = _memory(group, peak=True)
            failures = [error for _, error in imported + launched if error]
            return {"mode": mode, "idle": idle, "peak": peak, "failures": failures,
                    "oom killed": group.oom_killed()}
        finally:
            for client in clients:
                client.stop_channels()
            for manager in managers:
                manager.shutdown_kernel(now=True)
            time.sleep(2)
            group.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--limit", default=None, help="hold the kernels to this much memory (e.g. 4G), as the hub does")
    parser.add_argument("--only", choices=["shared", "per-kernel"], default=None)
    options = parser.parse_args()
    if os.geteuid() != 0 or cgroup_roots() is None:
        parser.error("needs root and a writable memory cgroup, to count the kernels' memory together: "
                     "sudo .venv/bin/python scripts/bench_launch_servers.py")
    limit = _bytes(options.limit) if options.limit else 64 << 30
    modes = [options.only] if options.only else ["per-kernel", "shared"]
    print(hardware_line(), flush=True)
    results = {}
    for mode in modes:
        result = measure(mode, options.notebooks, options.ranks, limit)
        results[mode] = result
        print(f"{options.notebooks} notebooks, {options.ranks} ranks each, launch server {mode:10s}: "
              f"idle {result['idle'] / 2**30:.2f} GiB, peak {result['peak'] / 2**30:.2f} GiB, "
              f"{'all launches succeeded' if not result['failures'] else 'FAILED: ' + result['failures'][0]}, "
              f"{'OOM killer struck' if result['oom killed'] else 'nothing killed'}", flush=True)
    if len(results) == 2:
        print(f"peak memory, one server per kernel / one per user: "
              f"{results['per-kernel']['peak'] / results['shared']['peak']:.2f}x")
    return 1 if any(r["failures"] or r["oom killed"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
