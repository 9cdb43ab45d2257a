"""Fake quantization with the official kernels' rounding (spec §12), against hand-computed values."""
from __future__ import annotations

import math

import pytest
import torch

from reference.fakequant import (fake_quant_fp4, fake_quant_fp8, hadamard, pow2_scale, round_e2m1)


def test_e2m1_round_to_nearest_even() -> None:
    x = torch.tensor([0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 6.0, -0.75, -2.5, -5.0])
    want = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -1.0, -2.0, -4.0]
    assert round_e2m1(x).tolist() == want


def test_pow2_scale_keeps_exact_powers_and_rounds_up() -> None:
    amax = torch.tensor([448.0, 449.0, 224.0, 1.0])
    assert pow2_scale(amax, 448.0).tolist() == [1.0, 2.0, 0.5, 2.0 ** math.ceil(math.log2(1 / 448))]
    assert pow2_scale(torch.tensor([6.0, 6.5, 3.0]), 6.0).tolist() == [1.0, 2.0, 0.5]


def test_fp8_block_fake_quant_hand_case() -> None:
    # block 1 amax 900 -> s = 2^ceil(log2(900/448)) = 4; block 2 amax 3 -> s = 2^-7
    x = torch.tensor([[900.0, 17.0 * 4, 1.0, -3.0 * 4 + 0.9] + [0.0] * 60 + [3.0, 0.0191, -1.0] + [0.0] * 61])
    q = fake_quant_fp8(x, 64)
    # 900/4 = 225 -> E4M3 224; 68/4 = 17 -> 16 (tie to even); 1/4 exact; -11.1/4 = -2.775 -> -2.75
    assert q[0, :4].tolist() == [896.0, 64.0, 1.0, -11.0]
    # 3 / 2^-7 = 384 exact; 0.0191 * 128 = 2.4448 -> 2.5; -128 exact
    assert q[0, 64:67].tolist() == [3.0, 2.5 / 128, -1.0]
    assert q.dtype == x.dtype


def test_fp8_amax_floor() -> None:
    # amax floored at 1e-4 -> s = 2^-22; 1e-9 / s = 0.0042 -> E4M3 2^-8 -> 2^-30 (no floor: 272 * 2^-38)
    tiny = torch.full((1, 128), 1e-9)
    assert torch.all(fake_quant_fp8(tiny, 128) == 2.0 ** -30)


def test_fp4_block_fake_quant_hand_case() -> None:
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([12.0, 5.0, -7.0, 0.9])    # amax 12 -> s = 2; x/s = 6, 2.5, -3.5, 0.45
    q = fake_quant_fp4(x, 32)
    assert q[0, :4].tolist() == [12.0, 4.0, -8.0, 1.0]


def test_bf16_in_bf16_out() -> None:
    x = torch.randn(3, 128).to(torch.bfloat16)
    assert fake_quant_fp8(x, 64).dtype == torch.bfloat16 and fake_quant_fp4(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="multiple"):
        fake_quant_fp8(torch.zeros(1, 100), 64)


def test_hadamard_matches_sylvester_and_is_orthonormal() -> None:
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    h8 = torch.kron(torch.kron(h2, h2), h2) / math.sqrt(8)
    x = torch.randn(5, 8)
    assert torch.allclose(hadamard(x), x @ h8.T, atol=1e-6)
    y = torch.randn(4, 128)
    assert torch.allclose(hadamard(hadamard(y)), y, atol=1e-5)        # H/√n is its own inverse
    assert torch.allclose(hadamard(y) @ hadamard(y).T, y @ y.T, atol=1e-3)
