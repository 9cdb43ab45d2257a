"""The float64 NVFP4 GEMM reference against a direct element-by-element computation."""
from __future__ import annotations

import pytest
import torch

from dsv4.numerics import (E2M1_VALUES, e4m3_decode, nvfp4_gemm_reference, nvfp4_quantize, swizzle_scales,
                           unpack_nibbles)


def direct(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Dequantize with a Python LUT and per-element scale lookup (no library dequantizer)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    codes = unpack_nibbles(packed).long()
    s = e4m3_decode(scales.view(torch.uint8)).double()
    col = torch.arange(codes.shape[1]) // 16
    return lut[codes] * s[:, col]


@pytest.mark.parametrize("m,n,k", [(1, 8, 16), (5, 3, 80), (33, 17, 272)])
def test_matches_direct_float64(m: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(m * n + k)
    pa, sa, ga = nvfp4_quantize(torch.randn(m, k, generator=gen))
    pb, sb, gb = nvfp4_quantize(torch.randn(n, k, generator=gen) * 0.02)
    want = torch.einsum("mk,nk->mn", direct(pa, sa), direct(pb, sb)) * (ga.double() * gb.double())
    got = nvfp4_gemm_reference(pa, sa, ga, pb, sb, gb)
    assert got.dtype == torch.float64 and got.shape == (m, n)
    assert torch.allclose(got, want, rtol=1e-13, atol=0)
    got_sw = nvfp4_gemm_reference(pa, swizzle_scales(sa), ga, pb, swizzle_scales(sb), gb,
                                  a_scale_layout="swizzled", b_scale_layout="swizzled")
    assert torch.equal(got_sw, got)


def test_small_integer_case_is_exact() -> None:
    # a = [6, 0, ...], b = [1.5, ...] with scale 2 and g = 1: y = 6*2 * 1.5*2 = 36, then * (ga*gb)
    a = torch.zeros(1, 16)
    a[0, 0] = 12.0
    b = torch.zeros(1, 16)
    b[0, 0] = 3.0
    b[0, 1] = 12.0  # sets b's block scale to 2
    pa, sa, _ = nvfp4_quantize(a, 1.0)
    pb, sb, _ = nvfp4_quantize(b, 1.0)
    assert nvfp4_gemm_reference(pa, sa, 0.5, pb, sb, 0.25).item() == 36.0 * 0.125


def test_validation() -> None:
    p, s, g = nvfp4_quantize(torch.randn(2, 32))
    q, t, h = nvfp4_quantize(torch.randn(2, 64))
    with pytest.raises(ValueError, match="K/2"):
        nvfp4_gemm_reference(p, s, g, q, t, h)
    with pytest.raises(ValueError, match="2-D"):
        nvfp4_gemm_reference(p.reshape(-1), s, g, p, s, g)
