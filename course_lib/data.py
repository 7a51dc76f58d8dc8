"""Small real datasets that work offline.

Defined in chapter 03 (DDP), reused by every chapter that trains a model::

    from course_lib.data import load_digits_tensors, split_train_test
    X, y = load_digits_tensors()              # 1797 real 8x8 handwritten digits
    X_train, y_train, X_test, y_test = split_train_test(X, y)

The digits ship inside scikit-learn (``sklearn.datasets.load_digits``), so nothing is
downloaded; ``load_digits_tensors`` reads scikit-learn's file itself, without importing
scikit-learn, whose import costs every process that loads the data (each rank) about a CPU-second
and 80 MiB of its own memory. MNIST is used
only when its files are already on disk (``load_mnist_if_present``); download it once,
while online, with ``torchvision.datasets.MNIST(root, download=True)``.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

__all__ = ["load_digits_tensors", "split_train_test", "load_mnist_if_present", "TaggedWithProcess"]


def load_digits_tensors(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's handwritten digits: ``X`` of shape (1797, 64) scaled to [0, 1], ``y`` int64 labels 0-9.

    The same numbers as ``sklearn.datasets.load_digits()`` (tests/test_data.py compares them).
    """
    import numpy as np

    table = np.loadtxt(_digits_file(), delimiter=",")  # one row a digit: 64 pixels, then the label
    X = torch.as_tensor(table[:, :-1], dtype=dtype) / 16.0  # pixel values are 0..16
    y = torch.as_tensor(table[:, -1].astype(np.int64))
    return X, y


def _digits_file() -> Path:
    """Where scikit-learn keeps the digits, found without importing it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed, and the digits data ship with it: "
                                  "run `make setup` (or `pip install scikit-learn`)")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise FileNotFoundError(f"scikit-learn has no {path.name} where it used to ({path}): "
                                "reinstall it with `make setup`")
    return path


def split_train_test(X: torch.Tensor, y: torch.Tensor, test_fraction: float = 0.2, seed: int = 0):
    """A seeded random split: ``(X_train, y_train, X_test, y_test)``, the same on every machine."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(X) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return X[train], y[train], X[test], y[test]


def load_mnist_if_present(root, train: bool = True, dtype: torch.dtype = torch.float32):
    """MNIST as ``(X, y)`` with ``X`` of shape (N, 784) scaled to [0, 1], or ``None`` if not on disk.

    Never downloads (``download=False``): the course must run offline.
    """
    try:
        from torchvision.datasets import MNIST
    except ImportError:
        return None
    try:
        mnist = MNIST(str(root), train=train, download=False)
    except RuntimeError:  # "Dataset not found": the files are not under root
        return None
    X = mnist.data.reshape(len(mnist.data), -1).to(dtype) / 255.0
    y = mnist.targets.to(torch.int64)
    return X, y


class TaggedWithProcess(torch.utils.data.Dataset):
    """A dataset whose samples also say which process loaded them (chapter 03, DataLoader workers).

    ``TaggedWithProcess(dataset)[i]`` is ``(*dataset[i], pid)``. It lives here, importable,
    because DataLoader worker processes started by spawn or forkserver import it by name.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        return (*self.dataset[index], os.getpid())
