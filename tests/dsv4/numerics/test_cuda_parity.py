"""The oracle is pure torch and device-agnostic: on a GPU every function must give the same bits as
on the CPU (it uses only IEEE-rounded float32 ops, integer bit manipulation and exact scalings)."""
from __future__ import annotations

import pytest
import torch

from dsv4.numerics import (e2m1_encode, e4m3_encode, fp4_fake_quantize_pow2, fp8_act_quantize, fp8_block_quantize,
                           mxfp4_dequantize, mxfp4_quantize, nvfp4_dequantize, nvfp4_quantize, swizzle_scales,
                           unswizzle_scales)

pytestmark = pytest.mark.gpu


def data() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 512, generator=gen)
    wide = x * torch.exp2(torch.randint(-40, 40, x.shape, generator=gen).float())
    blocky = (x.reshape(64, 32, 16) * torch.exp2(torch.randint(-50, 10, (64, 32, 1), generator=gen).float()))
    return [x, wide, blocky.reshape(64, 512), (x * 4).to(torch.bfloat16), torch.zeros(3, 512)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu):
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return torch.equal(a.cpu(), b) if not a.is_floating_point() else torch.equal(
        torch.nan_to_num(a.cpu(), nan=7.0), torch.nan_to_num(b, nan=7.0))


def test_element_codecs_match(device: str) -> None:
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    assert same(e2m1_encode(x.to(device)), e2m1_encode(x))
    assert same(e4m3_encode(x.to(device)), e4m3_encode(x))


@pytest.mark.parametrize("recipe", ["exact", "rcp"])
def test_nvfp4_matches(device: str, recipe: str) -> None:
    for x in data():
        for g in (None, 0.0123):
            out_c = nvfp4_quantize(x, g, recipe=recipe)
            out_d = nvfp4_quantize(x.to(device), g, recipe=recipe)
            assert all(same(d, c) for d, c in zip(out_d, out_c))
            assert same(nvfp4_dequantize(*out_d), nvfp4_dequantize(*out_c))


def test_pow2_formats_and_swizzle_match(device: str) -> None:
    for x in data():
        p, s = mxfp4_quantize(x)
        pd, sd = mxfp4_quantize(x.to(device))
        assert same(pd, p) and same(sd, s) and same(mxfp4_dequantize(pd, sd), mxfp4_dequantize(p, s))
        assert same(fp4_fake_quantize_pow2(x.to(device), 32), fp4_fake_quantize_pow2(x, 32))
        assert all(same(d, c) for d, c in zip(fp8_act_quantize(x.to(device), 64), fp8_act_quantize(x, 64)))
        w = x[:, :300]
        assert all(same(d, c) for d, c in zip(fp8_block_quantize(w.to(device)), fp8_block_quantize(w)))
    s = torch.randint(0, 255, (200, 7), dtype=torch.int32).to(torch.uint8)
    assert same(swizzle_scales(s.to(device)), swizzle_scales(s))
    assert same(unswizzle_scales(swizzle_scales(s).to(device), 200, 7), s)
