"""Walsh-Hadamard transform in Sylvester order, normalized (the indexer's rotation, spec §12)."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4.numerics import hadamard_transform


def sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("n", [1, 2, 8, 128])
def test_matches_the_sylvester_matrix(n: int) -> None:
    x = torch.randn(3, 5, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    want = x @ sylvester(n) / math.sqrt(n)
    assert torch.allclose(hadamard_transform(x), want, rtol=0, atol=1e-12)
    # float32 input: float32 butterfly, so only float32 rounding separates it from the fp64 matrix
    got32 = hadamard_transform(x.float())
    assert got32.dtype == torch.float32
    assert torch.allclose(got32.double(), want, rtol=0, atol=1e-5 * float(x.abs().max()) * math.log2(2 * n))


def test_row_order_is_sylvester_not_walsh() -> None:
    # e_1 maps to row 1 of H: alternating signs (Walsh/sequency order would differ for n >= 4)
    e = torch.zeros(8)
    e[1] = 1
    assert (hadamard_transform(e) * math.sqrt(8)).round().tolist() == [1, -1, 1, -1, 1, -1, 1, -1]


def test_is_an_involution_and_keeps_dtype() -> None:
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    y = hadamard_transform(x)
    assert y.dtype == torch.bfloat16
    xf = torch.randn(4, 64)
    assert torch.allclose(hadamard_transform(hadamard_transform(xf)), xf, atol=1e-6)


def test_rejects_non_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        hadamard_transform(torch.randn(2, 96))
