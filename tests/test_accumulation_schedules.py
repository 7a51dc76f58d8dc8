"""course_lib.schedules (chapter 07): the LR a scheduler gives per step, and one_thread()."""

import math

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

from course_lib.schedules import lr_trajectory, one_thread


def test_lr_trajectory_records_the_lr_in_force_before_each_step():
    lrs = lr_trajectory(lambda opt: LinearLR(opt, start_factor=0.5, total_iters=2), steps=4, base_lr=0.2)
    assert lrs == pytest.approx([0.1, 0.15, 0.2, 0.2])


def test_warmup_then_cosine_matches_the_formula():
    peak, total, warm = 0.64, 20, 5
    lrs = lr_trajectory(lambda opt: SequentialLR(opt, [LinearLR(opt, start_factor=1 / 8, total_iters=warm),
                                                       CosineAnnealingLR(opt, T_max=total - warm)],
                                                 milestones=[warm]), steps=total, base_lr=peak)
    expected = [peak * (1 / 8 + 7 / 8 * t / warm) if t < warm
                else peak / 2 * (1 + math.cos(math.pi * (t - warm) / (total - warm))) for t in range(total)]
    assert lrs == pytest.approx(expected)


def test_one_thread_restores_the_previous_setting_even_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with one_thread():
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
