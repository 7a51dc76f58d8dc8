"""The course's GPU path, checked on a machine with a GPU, in one command.

Usage: .venv/bin/python scripts/gpu_check.py [--skip-notebooks] [--jobs N] [--log FILE]

CI has no GPU, so what only a GPU can show is checked here, by a maintainer who has one:

1. a one-rank ``launch``: rank_device() is cuda:0, the group is cpu:gloo,cuda:nccl, and NCCL
   all-reduces a CUDA tensor while gloo all-reduces a CPU tensor in the same group;
2. DDP over NCCL on the GPU(s) == one CPU process (float64, 5 steps);
3. FSDP2 (fully_shard) on the GPU(s) == one CPU process (float64, 5 steps);
4. autocast("cuda", float16): a linear layer's output is fp16, softmax's fp32; GradScaler skips a
   step whose gradients overflow and halves its scale;
5. a 4-rank launch: a GPU per rank where there are 4, else every rank on the CPU, and its output
   begins with a line saying which; with CUDA_VISIBLE_DEVICES=0 exported, all on the CPU too;
6. the torchrun script that run_torchrun writes, on one process: cuda:0 and NCCL;
7. every lesson and solution notebook under ``pytest --nbval-lax`` with the GPU visible (the long
   part: about as long as the notebooks take on the CPU; --jobs N runs N notebooks side by side,
   --log FILE keeps pytest's whole report, --skip-notebooks leaves it out). Where nbformat and
   nbval are not installed (and cannot be), each notebook's code cells run in a plain Python
   process instead (scripts/run_cells.py: outputs not compared, as with --nbval-lax).

It ends with a summary (date, GPU, torch, each check) to quote in docs/platforms.md's platform table.
Without a GPU it says so and exits 0: nothing is checked.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 5


# --------------------------------------------------------------------------
# What the ranks run (sent by value to the workers)
# --------------------------------------------------------------------------
def _model(seed=0):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).double()


def _data():
    import torch

    generator = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 32, 16, dtype=torch.float64, generator=generator), \
        torch.randint(0, 4, (STEPS, 32), generator=generator)


def _train(model, rank=0, world=1, device="cpu"):
    import torch
    import torch.nn.functional as F

    X, y = _data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    share = X.shape[1] // world
    for step in range(STEPS):
        xb = X[step, rank * share:(rank + 1) * share].to(device)
        yb = y[step, rank * share:(rank + 1) * share].to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        optimizer.step()


def _flat(tensors):
    import torch

    return torch.cat([t.detach().reshape(-1).cpu() for t in tensors])


def reference_parameters():
    """One CPU process, the whole batch: what the GPU runs must reproduce."""
    model = _model()
    _train(model)
    return _flat(model.parameters())


def rank_nccl_and_gloo():
    import torch
    import torch.distributed as dist

    from course_lib.launcher import rank_device

    device = rank_device()
    on_gpu = torch.ones(3, device=device)
    on_cpu = torch.ones(3)
    dist.all_reduce(on_gpu)
    dist.all_reduce(on_cpu)
    return {"device": str(device), "backend": str(dist.get_backend()),
            "gpu_sum": on_gpu.cpu().tolist(), "cpu_sum": on_cpu.tolist()}


def rank_ddp():
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from course_lib.launcher import rank_device

    model = DDP(_model().to(rank_device()))
    _train(model, dist.get_rank(), dist.get_world_size(), rank_device())
    return {"device": str(rank_device()), "params": _flat(model.parameters())}


def rank_fsdp2():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from course_lib.launcher import rank_device

    device = rank_device()
    model = _model().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        if hasattr(layer, "weight"):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(model, dist.get_rank(), dist.get_world_size(), device)
    return {"device": str(device), "params": _flat(p.full_tensor() for p in model.parameters())}


def rank_placement():
    import torch.distributed as dist

    from course_lib.launcher import rank_device

    return str(rank_device()), str(dist.get_backend())


def torchrun_rank():
    import torch.distributed as dist

    from course_lib.launcher import rank_device

    dist.init_process_group(backend="cpu:gloo,cuda:nccl")
    try:
        return {"device": str(rank_device()), "backend": str(dist.get_backend())}
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------
# The checks: each returns a line of what it saw, or raises
# --------------------------------------------------------------------------
def _expect(condition, message):
    if not condition:
        raise AssertionError(message)


def check_one_rank_nccl():
    from course_lib import launch

    result = launch(rank_nccl_and_gloo, world_size=1, show_output=False)[0]
    _expect(result["device"] == "cuda:0", f"rank_device() is {result['device']}, not cuda:0")
    _expect("nccl" in result["backend"], f"the group is {result['backend']}, without NCCL")
    _expect(result["gpu_sum"] == [1.0] * 3 and result["cpu_sum"] == [1.0] * 3, f"sums {result}")
    return f"{result['device']}, group {result['backend']}, CUDA and CPU tensors all-reduced"


def _ranks():
    import torch

    return max(1, min(torch.cuda.device_count(), 4))  # a GPU per rank


def _compare(name, rank_fn):
    import torch

    from course_lib import launch

    ranks = _ranks()
    reference = reference_parameters()
    results = launch(rank_fn, world_size=ranks, show_output=False, timeout=300)
    gaps = []
    for rank, result in enumerate(results):
        _expect(result["device"] == f"cuda:{rank}", f"rank {rank} ran on {result['device']}")
        gaps.append((result["params"] - reference).abs().max().item())
        torch.testing.assert_close(result["params"], reference, rtol=1e-9, atol=1e-12,
                                   msg=lambda m, rank=rank: f"{name}, rank {rank} vs one CPU process: {m}")
    return f"{ranks} rank(s) on {ranks} GPU(s), float64, {STEPS} steps: largest gap {max(gaps):.1e}"


def check_ddp():
    return _compare("DDP", rank_ddp)


def check_fsdp2():
    return _compare("FSDP2", rank_fsdp2)


def check_autocast():
    import torch

    linear = torch.nn.Linear(8, 8).cuda()
    x = torch.randn(4, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        out = linear(x)
        probabilities = torch.softmax(out, dim=-1)
    _expect(out.dtype == torch.float16, f"linear under autocast gave {out.dtype}")
    _expect(probabilities.dtype == torch.float32, f"softmax under autocast gave {probabilities.dtype}")
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 16)
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1)
    before = [p.detach().clone() for p in linear.parameters()]
    with torch.autocast("cuda", dtype=torch.float16):
        loss = linear(x).float().sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    _expect(all(torch.equal(a, b) for a, b in zip(before, linear.parameters())), "the overflowing step was taken")
    _expect(scaler.get_scale() == 2.0 ** 15, f"scale after an overflow: {scaler.get_scale()}, not 2^15")
    return "linear fp16, softmax fp32; an inf step skipped, scale 65536 -> 32768"


def check_four_ranks():
    """Four ranks: a GPU each where there are four, else all on the CPU, and the output says which;
    with CUDA_VISIBLE_DEVICES=0 exported for the session, the one GPU is shared: the CPU again."""
    import contextlib
    import io

    import torch

    from course_lib import launch

    gpus = torch.cuda.device_count()
    expected = [(f"cuda:{rank}", "cpu:gloo,cuda:nccl") if gpus >= 4 else ("cpu", "gloo") for rank in range(4)]
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        placed = launch(rank_placement, world_size=4, timeout=120)
    _expect([tuple(p) for p in placed] == expected, f"4 ranks placed {placed}, expected {expected}")
    header = shown.getvalue().splitlines()[0]
    _expect(header.startswith("4 ranks "), f"the launch's output begins {header!r}, not with where its ranks ran")
    with mock.patch.dict(os.environ, CUDA_VISIBLE_DEVICES="0"):  # launch sends the kernel's variables
        shared = launch(rank_placement, world_size=4, timeout=120, show_output=False)
    _expect([tuple(p) for p in shared] == [("cpu", "gloo")] * 4, f"with CUDA_VISIBLE_DEVICES=0: {shared}")
    return f"header {header!r}; with CUDA_VISIBLE_DEVICES=0 exported, all 4 on the CPU (gloo)"


def check_torchrun():
    from course_lib.torchrun import run_torchrun

    result = run_torchrun(torchrun_rank, nproc_per_node=1, show_output=False, timeout=180)[0]
    _expect(result["device"] == "cuda:0", f"rank_device() under torchrun is {result['device']}")
    _expect("nccl" in result["backend"], f"the group under torchrun is {result['backend']}")
    return f"torchrun, 1 process: {result['device']}, group {result['backend']}"


def check_notebooks(jobs=1, log=None):
    try:
        import nbformat  # noqa: F401
        import nbval  # noqa: F401
    except ImportError:  # a lent machine's own image, where nothing can be installed
        return check_notebooks_without_jupyter(log)
    command = [sys.executable, "-m", "pytest", "notebooks", "solutions", "--nbval-lax", "--nbval-current-env",
               "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=600", "-p", "no:randomly",
               "-v" if log else "-q", "--durations=25"]
    if jobs > 1:  # a notebook's cells share one kernel, so a notebook stays on one worker
        command += ["-n", str(jobs), "--dist", "loadfile"]
    if log:  # written as it runs: a run killed at a time limit keeps it
        with open(log, "w", encoding="utf-8") as report:
            done = subprocess.run(command, cwd=ROOT, stdout=report, stderr=subprocess.STDOUT)
        output = Path(log).read_text(encoding="utf-8")
    else:
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        output = done.stdout
    tail = [line for line in output.splitlines() if line.strip()][-60:]
    summary = tail[-1] if tail else "(no output)"
    if done.returncode != 0:
        failed = [line for line in tail if line.startswith("FAILED")]
        raise AssertionError(f"{summary}\n" + "\n".join(failed))
    return f"every lesson and solution under nbval-lax: {summary.strip('= ')}"


def check_notebooks_without_jupyter(log=None):
    """Every lesson and solution, its code cells run in a plain Python process (scripts/run_cells.py)."""
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_cells.py"), *map(str, notebooks)],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        Path(log).write_text(done.stdout, encoding="utf-8")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else "(no output)"
    if done.returncode != 0:
        raise AssertionError(summary + "\n" + "\n".join(line for line in lines if line.startswith("FAILED")))
    return f"no Jupyter here, so scripts/run_cells.py: {summary}"


CHECKS = [("one-rank launch, NCCL and gloo", check_one_rank_nccl), ("DDP on CUDA == CPU", check_ddp),
          ("FSDP2 on CUDA == CPU", check_fsdp2), ("autocast and GradScaler on CUDA", check_autocast),
          ("four ranks, where they run", check_four_ranks), ("torchrun script on the GPU", check_torchrun),
          ("notebooks with the GPU visible", check_notebooks)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-notebooks", action="store_true", help="leave out the nbval run of every notebook")
    parser.add_argument("--jobs", type=int, default=1, help="notebooks run side by side (pytest-xdist), default 1")
    parser.add_argument("--log", help="write pytest's whole report of the notebooks to this file")
    options = parser.parse_args(argv)
    import torch

    today = datetime.date.today().isoformat()
    if not torch.cuda.is_available():
        print(f"{today}: torch {torch.__version__}, no GPU: nothing checked")
        return 0
    os.chdir(ROOT)
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"{today}: {len(gpus)} x {gpus[0]}, torch {torch.__version__} (CUDA {torch.version.cuda})")
    results = []
    for name, check in CHECKS:
        if options.skip_notebooks and check is check_notebooks:
            results.append((name, "skipped", "--skip-notebooks"))
            continue
        started = time.perf_counter()
        try:
            line = check(options.jobs, options.log) if check is check_notebooks else check()
            status = "passed"
        except Exception as exc:  # noqa: BLE001 - every check runs, the summary says which failed
            line, status = f"{type(exc).__name__}: {exc}", "FAILED"
        results.append((name, status, f"{line} ({time.perf_counter() - started:.0f} s)"))
        print(f"  {status:7} {name}: {results[-1][2]}", flush=True)
    failed = [name for name, status, _ in results if status == "FAILED"]
    print(f"\nSummary, {today}, {len(gpus)} x {gpus[0]}, torch {torch.__version__}: "
          f"{sum(status == 'passed' for _, status, _ in results)} of {len(results)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
