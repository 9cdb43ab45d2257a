"""The 32_4_4 scale swizzle against two independent formulations (spec nvfp4-and-kernels.md §3.6)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.numerics import swizzle_scales, swizzled_numel, unswizzle_scales


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def swizzle_by_offset_loop(s: torch.Tensor) -> torch.Tensor:
    """Scalar loop over the spec's offset formula, written independently of the library."""
    r, c = s.shape
    rp, cp = ceil_div(r, 128) * 128, ceil_div(c, 4) * 4
    out = torch.zeros(rp * cp, dtype=s.dtype)
    for row in range(r):
        mt, rem = divmod(row, 128)
        r1, r0 = divmod(rem, 32)
        for col in range(c):
            kt, cc = divmod(col, 4)
            out[((mt * (cp // 4) + kt) * 32 + r0) * 16 + r1 * 4 + cc] = s[row, col]
    return out


def to_blocked(s: torch.Tensor) -> torch.Tensor:
    """The torch/torchao ``to_blocked`` formulation (128x4 blocks, then a 4x32 -> 32x4 transpose)."""
    r, c = s.shape
    rb, cb = ceil_div(r, 128), ceil_div(c, 4)
    p = torch.zeros(rb * 128, cb * 4, dtype=s.dtype)
    p[:r, :c] = s
    blocks = p.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1, 32, 16).flatten()


def test_matches_the_offset_formula_on_a_padded_case() -> None:
    s = torch.arange(1, 130 * 6 + 1, dtype=torch.int32).reshape(130, 6)  # pads rows and columns
    flat = swizzle_scales(s)
    assert flat.shape == (256 * 8,) and swizzled_numel(130, 6) == 256 * 8
    assert torch.equal(flat, swizzle_by_offset_loop(s))
    assert int((flat == 0).sum()) == 256 * 8 - 130 * 6  # padding is zero


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 13))
def test_swizzle_matches_to_blocked_and_inverts(r: int, c: int) -> None:
    s = torch.randint(1, 255, (r, c), dtype=torch.int32).to(torch.uint8)
    flat = swizzle_scales(s)
    assert torch.equal(flat, to_blocked(s))
    assert torch.equal(unswizzle_scales(flat, r, c), s)


def test_float8_scales_and_expert_stacks() -> None:
    s = (torch.rand(3, 40, 5) * 400).to(torch.float8_e4m3fn)
    flat = swizzle_scales(s)
    assert flat.dtype == torch.float8_e4m3fn and flat.shape == (3, swizzled_numel(40, 5))
    for e in range(3):  # a stack is swizzled expert by expert
        assert torch.equal(flat[e].view(torch.uint8), swizzle_scales(s[e]).view(torch.uint8))
    back = unswizzle_scales(flat.reshape(-1).reshape(3, -1), 40, 5)
    assert torch.equal(back.view(torch.uint8), s.view(torch.uint8))


def test_unswizzle_validates_size() -> None:
    with pytest.raises(ValueError, match=r"round_up\(10,128\)"):
        unswizzle_scales(torch.zeros(100, dtype=torch.uint8), 10, 4)
    with pytest.raises(ValueError, match=r"\[..., R, S\]"):
        swizzle_scales(torch.zeros(5))
