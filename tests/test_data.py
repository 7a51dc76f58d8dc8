"""course_lib.data: the digits every training chapter uses, as scikit-learn gives them."""

import subprocess
import sys

import torch

from course_lib.data import load_digits_tensors


def test_the_digits_are_scikit_learns_numbers():
    from sklearn.datasets import load_digits

    digits = load_digits()
    X, y = load_digits_tensors()
    assert X.shape == (1797, 64) and X.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(X, torch.as_tensor(digits.data, dtype=torch.float32) / 16.0)
    assert torch.equal(y, torch.as_tensor(digits.target, dtype=torch.int64))
    X64, _ = load_digits_tensors(torch.float64)
    assert torch.equal(X64, torch.as_tensor(digits.data, dtype=torch.float64) / 16.0)


def test_loading_them_does_not_import_scikit_learn():
    # a rank that loads the digits should not pay scikit-learn's import (a CPU-second, ~80 MiB)
    code = ("import sys; from course_lib.data import load_digits_tensors; load_digits_tensors(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy')))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
