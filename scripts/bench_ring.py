"""Benchmark chapter 05's hand-made ring all-reduce against gloo's all_reduce.

Usage:
    .venv/bin/python scripts/bench_ring.py [--sizes-mb 1 16 64] [--world-sizes 2 4] [--rounds 3]

In one run: for each world size, the ring built from isend/recv (the same algorithm as
notebooks/05_ring_allreduce.ipynb) and gloo's ``dist.all_reduce`` at each size, their bus
bandwidth (nccl-tests' definition: S / t × 2(N-1)/N) and the ratio ring / gloo; and this
machine's memory-copy bandwidth, the ceiling for ranks that talk through loopback.

Each round times every (size, implementation) pair once, one after the other, so that
background load hits both alike; the table keeps each pair's best round. The target: the
hand ring reaches at least 0.8x gloo's busbw at 16 MB on 2 ranks (printed as a last line;
the exit status is 1 when it is missed and --strict is given).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from course_lib import launch  # noqa: E402
from course_lib.bandwidth import bus_bandwidth, memcpy_bandwidth, time_calls  # noqa: E402
from course_lib.hardware import hardware_line  # noqa: E402

TARGET_RATIO, TARGET_SIZE_MB, TARGET_RANKS = 0.8, 16, 2


def ring_all_reduce(tensor):
    """Reduce-scatter then all-gather over N chunks, from isend/recv (as in chapter 05)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    chunks = tensor.view(-1).tensor_split(world_size)
    incoming = torch.empty_like(chunks[0])
    for step in range(world_size - 1):
        send_index, recv_index = (rank - step) % world_size, (rank - step - 1) % world_size
        received = incoming[:chunks[recv_index].numel()]
        request = dist.isend(chunks[send_index], right)
        dist.recv(received, left)
        chunks[recv_index].add_(received)
        request.wait()
    for step in range(world_size - 1):
        send_index, recv_index = (rank + 1 - step) % world_size, (rank - step) % world_size
        request = dist.isend(chunks[send_index], right)
        dist.recv(chunks[recv_index], left)
        request.wait()


def timed_rounds(sizes_bytes, rounds):
    """{(implementation, size): best seconds per call over the rounds}."""
    implementations = {"gloo": dist.all_reduce, "ring": ring_all_reduce}
    best = {}
    for _ in range(rounds):
        for size in sizes_bytes:
            tensor = torch.ones(size // 4)
            for name, fn in implementations.items():
                seconds = time_calls(fn, tensor, calls=3)
                best[name, size] = min(best.get((name, size), float("inf")), seconds)
    # check once that the ring is right at the largest size, so a fast wrong ring cannot win
    torch.manual_seed(dist.get_rank())
    x = torch.randn(sizes_bytes[-1] // 4)
    expected = x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(x)
    torch.testing.assert_close(x, expected)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    if any(n < 2 or n > 4 for n in args.world_sizes):
        parser.error("--world-sizes: use 2, 3 or 4 ranks (the course keeps to 4 ranks on one machine)")

    sizes = [mb * 2**20 for mb in args.sizes_mb]
    print(hardware_line())
    memcpy = memcpy_bandwidth()
    print(f"memcpy bandwidth: {memcpy / 1e9:.2f} GB/s (one 64 MiB tensor copy, best of 5)")
    print(f"{'ranks':>5} {'size':>7} {'gloo busbw':>11} {'ring busbw':>11} {'ring/gloo':>9} {'gloo/memcpy':>11}")
    target_ratio = None
    for world_size in args.world_sizes:
        best = launch(timed_rounds, world_size=world_size, args=(sizes, args.rounds), timeout=600,
                      show_output=False)[0]
        for mb, size in zip(args.sizes_mb, sizes):
            gloo = bus_bandwidth(size, best["gloo", size], "all_reduce", world_size)
            ring = bus_bandwidth(size, best["ring", size], "all_reduce", world_size)
            print(f"{world_size:>5} {mb:>4} MB {gloo / 1e9:>7.2f} GB/s {ring / 1e9:>6.2f} GB/s "
                  f"{ring / gloo:>9.2f} {gloo / memcpy:>11.0%}")
            if (world_size, mb) == (TARGET_RANKS, TARGET_SIZE_MB):
                target_ratio = ring / gloo
    if target_ratio is None:
        print(f"target not measured (needs {TARGET_SIZE_MB} MB on {TARGET_RANKS} ranks)")
        return 0
    met = target_ratio >= TARGET_RATIO
    print(f"target ring >= {TARGET_RATIO}x gloo busbw at {TARGET_SIZE_MB} MB on {TARGET_RANKS} ranks: "
          f"{target_ratio:.2f}x, {'met' if met else 'MISSED'}")
    return 1 if (args.strict and not met) else 0


if __name__ == "__main__":
    sys.exit(main())
