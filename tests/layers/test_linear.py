"""The plain product x W^T (+ b) of `layers/linear.linear`: on the CPU a few rows are multiplied the other way
round, (W x^T)^T, and more rows as x W^T; each is checked against a float64 reference, with a bias, into a
buffer, and with rows that lie apart."""

import pytest
import torch

from nanovllm.layers.linear import GEMV_MAX_ROWS, linear


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ weight.double().T
    return (y if bias is None else y + bias.double()).float()


@pytest.mark.parametrize("rows", [1, 3, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1])
@pytest.mark.parametrize("with_bias", [False, True])
def test_a_product_on_the_cpu_equals_the_reference_however_many_rows(rows, with_bias):
    torch.manual_seed(rows)
    x, weight = torch.randn(rows, 48), torch.randn(40, 48)
    bias = torch.randn(40) if with_bias else None
    got = linear(x, weight, bias)
    assert got.shape == (rows, 40) and got.is_contiguous()
    torch.testing.assert_close(got, reference(x, weight, bias))


@pytest.mark.parametrize("rows", [3, GEMV_MAX_ROWS + 1])
def test_a_product_is_written_into_the_rows_of_a_buffer_from_rows_that_lie_apart(rows):
    torch.manual_seed(0)
    x = torch.randn(rows, 2, 48)[:, 0]  # each row 96 values after the one before
    weight, bias = torch.randn(40, 48), torch.randn(40)
    buffer = torch.full((rows + 2, 40), float("nan"))
    got = linear(x, weight, bias, out=buffer[:rows])
    assert got.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer[:rows], reference(x, weight, bias))
    assert buffer[rows:].isnan().all()
