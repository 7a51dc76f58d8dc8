"""course_lib.precision: bit fields, layouts and byte counts against torch itself."""

import math

import pytest
import torch

from course_lib.precision import DOCUMENTED_CUDA_FP32_OPS, LAYOUTS, bit_fields, tensor_bytes


@pytest.mark.parametrize("dtype", list(LAYOUTS))
def test_layouts_add_up_to_the_format_width(dtype):
    assert sum(LAYOUTS[dtype]) == torch.finfo(dtype).bits
    assert torch.finfo(dtype).eps == 2.0 ** -LAYOUTS[dtype][2]


@pytest.mark.parametrize("value, dtype, expected", [
    (1.0, torch.float16, ("0", "01111", "0000000000")),
    (-2.0, torch.bfloat16, ("1", "10000000", "0000000")),
    (65504.0, torch.float16, ("0", "11110", "1111111111")),
    (2.0 ** -24, torch.float16, ("0", "00000", "0000000001")),
    (math.inf, torch.float32, ("0", "1" * 8, "0" * 23)),
    (1e5, torch.float16, ("0", "11111", "0000000000")),  # rounds to inf
])
def test_bit_fields(value, dtype, expected):
    assert bit_fields(value, dtype) == expected


@pytest.mark.parametrize("dtype", list(LAYOUTS))
def test_bit_fields_round_trip_through_the_integer_view(dtype):
    values = torch.randn(50, generator=torch.Generator().manual_seed(0)).to(dtype)
    int_type = {4: torch.int32, 2: torch.int16}[values.element_size()]
    for value, raw in zip(values.tolist(), values.view(int_type).tolist()):
        bits = "".join(bit_fields(value, dtype))
        assert int(bits, 2) == raw & ((1 << (8 * values.element_size())) - 1)


def test_bit_fields_rejects_other_dtypes():
    with pytest.raises(ValueError, match="bit_fields knows"):
        bit_fields(1.0, torch.float64)


def test_tensor_bytes_counts_elements_times_size():
    tensors = [torch.zeros(3, 4, dtype=torch.float16), torch.zeros(5), torch.zeros(2, dtype=torch.bfloat16)]
    assert tensor_bytes(tensors) == 3 * 4 * 2 + 5 * 4 + 2 * 2
    assert tensor_bytes([]) == 0


def test_documented_cuda_list_holds_the_losses_the_lesson_checks():
    assert {"cross_entropy", "nll_loss", "mse_loss", "softmax", "layer_norm"} <= DOCUMENTED_CUDA_FP32_OPS
    assert "linear" not in DOCUMENTED_CUDA_FP32_OPS
