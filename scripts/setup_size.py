"""How much disk the course's .venv takes, and how much of it is NVIDIA's CUDA libraries.

Usage: .venv/bin/python scripts/setup_size.py [VENV]   (default: .venv)

The README's quick start quotes what this prints, with its date. PyPI's Linux torch brings the CUDA
libraries as packages of their own (site-packages/nvidia, cuda*, triton); PyTorch's CPU wheels
(TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu) leave them out.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

CUDA_PACKAGES = ("nvidia", "cuda", "triton")  # folders in site-packages that only a GPU uses


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            path = Path(root, name)
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def main(argv: list[str]) -> int:
    venv = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / ".venv")
    if not venv.is_dir():
        print(f"{venv}: no such folder (make setup makes it)", file=sys.stderr)
        return 2
    site_packages = next(venv.glob("lib/python3*/site-packages"), None)
    cuda = sum(folder_bytes(path) for path in (site_packages.iterdir() if site_packages else [])
               if path.is_dir() and path.name.split("-")[0] in CUDA_PACKAGES)
    print(f"{datetime.date.today()}: {venv} takes {folder_bytes(venv) / 1e9:.1f} GB of disk, "
          f"{cuda / 1e9:.1f} GB of it NVIDIA's CUDA libraries and triton")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
