"""FP8 E4M3 with UE8M0 scales: 128x128 weight blocks and the official per-token activation quantizer
(spec dsv4-architecture.md §2.3, §12)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.numerics import (fp8_act_dequantize, fp8_act_quantize, fp8_block_dequantize, fp8_block_quantize,
                           fp8_fake_quantize_pow2)

INV448 = torch.tensor(1.0 / 448.0, dtype=torch.float32)


def official_act_quant(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Transcription of the official ``act_quant(scale_fmt=...)`` with torch's in-range e4m3 cast."""
    b = x.float().reshape(*x.shape[:-1], -1, block)
    amax = b.abs().amax(-1).clamp(min=1e-4)
    s = torch.exp2(torch.ceil(torch.log2((amax * INV448).double()))).float()
    q = (b / s.unsqueeze(-1)).clamp(-448, 448).to(torch.float8_e4m3fn)
    return q.reshape(x.shape), s


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.sampled_from([64, 128]), st.integers(1, 3),
       st.sampled_from([(1,), (4,), (2, 3)]), st.sampled_from(["normal", "wide", "tiny"]))
def test_act_quant_matches_the_official_formula(seed: int, block: int, nblk: int, lead: tuple[int, ...],
                                                kind: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, block * nblk, generator=gen)
    if kind == "wide":
        x = x * torch.exp2(torch.randint(-30, 30, x.shape, generator=gen).float())
    elif kind == "tiny":  # below the 1e-4 amax floor
        x = x * 1e-7
    x = x.to(torch.bfloat16)
    q, s = fp8_act_quantize(x, block)
    q_ref, s_ref = official_act_quant(x, block)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.uint8
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.int() - 127, torch.log2(s_ref).int())
    deq = fp8_act_dequantize(q, s)
    assert torch.equal(deq, q_ref.float() * s_ref.repeat_interleave(block, -1))
    assert torch.equal(fp8_fake_quantize_pow2(x, block), deq.to(torch.bfloat16))


def test_act_scale_keeps_exact_powers_of_two_and_never_clips() -> None:
    x = torch.zeros(3, 128)
    x[0, 0], x[1, 0], x[2, 0] = 448.0, float(torch.nextafter(torch.tensor(448.0), torch.tensor(1e4))), 0.0
    q, s = fp8_act_quantize(x)
    assert s[:, 0].tolist() == [127, 128, 127 - 22]  # 2^0; 2^1; floor 1e-4 -> 2^ceil(log2(1e-4/448)) = 2^-22
    assert fp8_act_dequantize(q, s)[0, 0].item() == 448.0


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.integers(0, 2 ** 31 - 1))
def test_block_quant_round_trip_and_scale_rule(n: int, k: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.exp2(torch.randint(-8, 8, (1,), generator=gen).float())
    q, s = fp8_block_quantize(w)
    assert q.shape == (n, k) and s.shape == (-(-n // 128), -(-k // 128)) and s.dtype == torch.uint8
    deq = fp8_block_dequantize(q, s)
    scale = torch.exp2(s.float() - 127).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    # E4M3 rounding: half a step, i.e. <= 2^-4 relative for normals, 2^-10 * scale absolute below
    assert ((deq - w).abs() <= torch.maximum(w.abs() * 2.0 ** -4, scale * 2.0 ** -10)).all()
    # the scale is the smallest power of two with amax <= 448 * scale
    pad = torch.zeros(s.shape[0] * 128, s.shape[1] * 128)
    pad[:n, :k] = w
    amax = pad.reshape(s.shape[0], 128, s.shape[1], 128).abs().amax((1, 3))
    sc = torch.exp2(s.float() - 127)
    assert (amax <= 448 * sc).all() and (amax > 224 * sc).all()


def test_block_quantizing_quantized_weights_is_a_fixed_point() -> None:
    gen = torch.Generator().manual_seed(2)
    q = (torch.rand(200, 260, generator=gen) * 896 - 448).to(torch.float8_e4m3fn)
    q[::128, ::128] = 448.0  # every block reaches the top of the E4M3 range
    s = torch.randint(100, 140, (2, 3), generator=gen).to(torch.uint8)
    q2, s2 = fp8_block_quantize(fp8_block_dequantize(q, s))
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8)) and torch.equal(s2, s)
    # checkpoints may carry the scales as float8_e8m0fnu
    assert torch.equal(fp8_block_dequantize(q, s.view(torch.float8_e8m0fnu)), fp8_block_dequantize(q, s))


def test_non_finite_blocks_become_nan() -> None:
    w = torch.randn(130, 130)
    w[129, 3] = float("inf")
    q, s = fp8_block_quantize(w)
    assert s[1, 0].item() == 255 and (s[0] != 255).all() and s[1, 1].item() != 255
    deq = fp8_block_dequantize(q, s)
    assert torch.isnan(deq[128:, :128]).all() and torch.isfinite(deq[:128]).all()
    x = torch.randn(2, 128)
    x[1, 0] = float("nan")
    q, s = fp8_act_quantize(x, 64)
    assert s.tolist()[1][0] == 255 and torch.isnan(fp8_act_dequantize(q, s)[1, :64]).all()


def test_validation() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        fp8_act_quantize(torch.randn(2, 100))
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        fp8_block_quantize(torch.randn(2, 3, 4))
    q, s = fp8_block_quantize(torch.randn(10, 10))
    with pytest.raises(ValueError, match="scales shape"):
        fp8_block_dequantize(q, torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="w dtype"):
        fp8_block_dequantize(q.float(), s)
    q, s = fp8_act_quantize(torch.randn(2, 128), 64)
    with pytest.raises(ValueError, match="shapes"):
        fp8_act_dequantize(q, torch.zeros(2, 3, dtype=torch.uint8))
