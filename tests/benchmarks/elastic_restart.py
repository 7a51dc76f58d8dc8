"""How often does a torchrun elastic restart succeed?  Trials for chapter 04's numbers.

Each trial runs a 2-rank training under ``torchrun --standalone --max-restarts=1``; rank 1
SIGKILLs itself mid-training on the first attempt; the restarted workers resume from the
snapshot. A trial succeeds when torchrun exits 0 and the final weights equal an uninterrupted
run's; it fails when torchrun exits with an error; it hangs when it is still running after
``--trial-timeout`` seconds (then every agent and worker is stopped). Run both configurations,
interleaved so background load hits them alike:

    python tests/benchmarks/elastic_restart.py --trials 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from course_lib.torchrun import TorchrunError, TorchrunTimeout, run_agents  # noqa: E402
from course_lib.torchrun_script import write_torchrun_script  # noqa: E402

STEPS = 12


def train_with_snapshots(folder, kill_at=-1):
    import signal

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    rank = dist.get_rank()
    snapshot = os.path.join(folder, "snapshot.pt")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, sampler=sampler)
    step = 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    while step < STEPS:
        sampler.set_epoch(step // len(loader))
        for i, (xb, yb) in enumerate(loader):
            if i < step % len(loader):
                continue
            if step == kill_at and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
            opt.step()
            step += 1
            if rank == 0 and step % 3 == 0:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                           snapshot + ".partial")
                os.replace(snapshot + ".partial", snapshot)
            dist.barrier()
            if step == STEPS:
                break
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def trial(script, folder, kill_at, env, timeout, options=()):
    try:
        run = run_agents(script, [["--standalone", "--nproc-per-node=2", "--max-restarts=1", *options]],
                         script_args=(), timeout=timeout, env=env, show_output=False)
        return "ok", run.results
    except TorchrunTimeout:
        return "hang", None
    except TorchrunError:
        return "fail", None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--trial-timeout", type=float, default=90)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    ref_dir = work / "reference"
    ref_dir.mkdir()
    ref_script = write_torchrun_script(train_with_snapshots, work / "reference.py", args=(str(ref_dir), -1))
    status, reference = trial(ref_script, ref_dir, -1, {}, args.trial_timeout)
    assert status == "ok", status
    configs = {"shared store (default)": {}, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1":
               {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
    tally = {name: {"ok": 0, "wrong": 0, "fail": 0, "hang": 0, "seconds": []} for name in configs}
    for t in range(args.trials):
        for name, env in configs.items():
            folder = work / f"{t}-{len(tally[name]['seconds'])}-{abs(hash(name))}"
            folder.mkdir()
            script = write_torchrun_script(train_with_snapshots, folder / "train.py", args=(str(folder), 7))
            start = time.monotonic()
            status, results = trial(script, folder, 7, env, args.trial_timeout)
            if status == "ok" and not all(torch.allclose(r, reference[0]) for r in results):
                status = "wrong"
            tally[name][status] += 1
            tally[name]["seconds"].append(time.monotonic() - start)
            print(f"trial {t}: {name}: {status} in {time.monotonic() - start:.1f} s", flush=True)
    for name, counts in tally.items():
        print(f"{name}: {counts['ok']} of {args.trials} restarts succeeded and matched "
              f"(failed {counts['fail']}, hung {counts['hang']}, wrong {counts['wrong']})")


if __name__ == "__main__":
    main()
