"""MXFP4 and the indexer's power-of-two FP4 fake quantization (spec dsv4-architecture.md §2.3, §12)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.numerics import (e2m1_decode, e2m1_encode, fp4_fake_quantize_pow2, mxfp4_dequantize, mxfp4_quantize,
                           pack_nibbles, unpack_nibbles)

INV6 = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # float32-rounded, as the official kernel uses


def official_scale(amax: torch.Tensor) -> torch.Tensor:
    """Independent transcription of the official rule with log2/ceil (exact on float32 powers of two)."""
    y = amax.float().clamp(min=6 * 2.0 ** -126) * INV6
    return torch.exp2(torch.ceil(torch.log2(y.double()))).float()


def test_scale_is_the_smallest_power_of_two_that_does_not_clip() -> None:
    # amax = 6 * 2^k exactly keeps 2^k; one float32 ulp above moves to 2^(k+1); one below keeps 2^k.
    k = torch.arange(-100, 100, dtype=torch.float32)
    a = 6 * torch.exp2(k)
    for amax, want in ((a, torch.exp2(k)), (torch.nextafter(a, 2 * a), torch.exp2(k + 1)),
                       (torch.nextafter(a, 0 * a), torch.exp2(k))):
        x = torch.zeros(len(k), 32)
        x[:, 5] = -amax
        _, s = mxfp4_quantize(x)
        assert torch.equal(s[:, 0].int() - 127, torch.log2(want).int())
        assert torch.equal(official_scale(amax), want)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.integers(1, 4), st.sampled_from([(1,), (3,), (2, 3)]),
       st.sampled_from(["normal", "wide", "zeros"]))
def test_mxfp4_matches_the_official_formula(seed: int, nblk: int, lead: tuple[int, ...], kind: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, 32 * nblk, generator=gen)
    if kind == "wide":
        x = x * torch.exp2(torch.randint(-60, 60, x.shape, generator=gen).float())
    elif kind == "zeros":
        x = x * (torch.rand(x.shape, generator=gen) < 0.1)
    x = x.to(torch.bfloat16)
    packed, s = mxfp4_quantize(x)
    blocks = x.float().reshape(*lead, nblk, 32)
    scale = official_scale(blocks.abs().amax(-1))
    assert torch.equal(s.int() - 127, torch.log2(scale).int())
    assert (blocks.abs() <= 6 * scale.unsqueeze(-1)).all()  # nothing clips
    want = e2m1_encode((blocks / scale.unsqueeze(-1)).clamp(-6, 6)).reshape(x.shape)
    assert torch.equal(unpack_nibbles(packed), want)
    # the fake quantization is the same numbers, dequantized, in the input dtype
    fake = fp4_fake_quantize_pow2(x, 32)
    assert fake.dtype == torch.bfloat16
    assert torch.equal(fake, mxfp4_dequantize(packed, s).to(torch.bfloat16))


def test_quantizing_dequantized_data_is_a_fixed_point() -> None:
    # Every block holds a +-6 code, so its amax is 6 * 2^(e-127): the scale and all codes come back.
    gen = torch.Generator().manual_seed(11)
    codes = torch.randint(0, 16, (8, 64), generator=gen).to(torch.uint8)
    codes[:, ::32] = 15
    s = torch.randint(100, 150, (8, 2), generator=gen).to(torch.uint8)
    packed = pack_nibbles(codes)
    p2, s2 = mxfp4_quantize(mxfp4_dequantize(packed, s))
    assert torch.equal(p2, packed) and torch.equal(s2, s)
    # the official checkpoint stores int8 nibbles and float8_e8m0fnu scales: both are accepted
    assert torch.equal(mxfp4_dequantize(packed.view(torch.int8), s.view(torch.float8_e8m0fnu)),
                       mxfp4_dequantize(packed, s))


def test_dequantize_is_lut_times_power_of_two() -> None:
    packed = pack_nibbles(torch.arange(32, dtype=torch.int32).remainder(16).to(torch.uint8).unsqueeze(0))
    out = mxfp4_dequantize(packed, torch.tensor([[130]], dtype=torch.uint8))
    assert torch.equal(out[0], e2m1_decode(torch.arange(32).remainder(16).to(torch.uint8)) * 8)
    assert torch.isnan(mxfp4_dequantize(packed, torch.tensor([[255]], dtype=torch.uint8))).all()


def test_fake_quant_other_blocks_zeros_and_nan() -> None:
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    assert torch.equal(fp4_fake_quantize_pow2(torch.zeros_like(x)), torch.zeros_like(x))
    y = fp4_fake_quantize_pow2(x, block=64)
    rel = ((y.float() - x.float()).abs() / x.float().abs().reshape(2, 2, 64).amax(-1).repeat_interleave(64, -1))
    # half the largest grid step is 1.0 * s, and s < 2 * amax / 6 (the smallest power of two >= amax/6)
    assert rel.max() <= 1 / 3
    x[1, 70] = float("nan")
    y = fp4_fake_quantize_pow2(x, block=64)
    assert torch.isnan(y[1, 64:]).all() and torch.isfinite(y[1, :64]).all() and torch.isfinite(y[0]).all()
    _, s = mxfp4_quantize(x[:, :96].float())
    assert s[1, 2].item() == 255 and s[1, 1].item() != 255


def test_validation() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4_quantize(torch.randn(2, 48))
    with pytest.raises(ValueError, match=r"scales_ue8m0 shape"):
        mxfp4_dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="dtype"):
        mxfp4_dequantize(torch.zeros(2, 16, dtype=torch.int16), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 64"):
        fp4_fake_quantize_pow2(torch.randn(2, 96), block=64)
