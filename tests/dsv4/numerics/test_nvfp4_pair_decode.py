"""nvfp4_dequantize's one-gather decode (a table of byte -> two E2M1 values) gives the bits of the
nibble-by-nibble decode it replaced: every packed byte against every E4M3 scale byte, several global
scales (1.0 takes the skipped-multiply path), leading dims, and both scale layouts."""
from __future__ import annotations

import pytest
import torch

from dsv4.numerics import nvfp4_dequantize, swizzle_scales
from dsv4.numerics.e2m1 import decode_codes_unchecked, unpack_nibbles
from dsv4.numerics.e4m3 import e4m3_decode
from dsv4.numerics.nvfp4 import decode_packed_pairs


def nibble_decode(packed: torch.Tensor, scales: torch.Tensor, g: float | torch.Tensor) -> torch.Tensor:
    """The nibble-by-nibble form: codes, their values, times the block scale, times g."""
    lead, k = tuple(packed.shape[:-1]), 2 * int(packed.shape[-1])
    vals = decode_codes_unchecked(unpack_nibbles(packed)).reshape(*lead, k // 16, 16)
    g = g if torch.is_tensor(g) else torch.tensor(float(g))
    return ((vals * e4m3_decode(scales).unsqueeze(-1)) * g).reshape(*lead, k)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def every_byte_by_every_scale() -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of K = 16: each of the 256 scale bytes meets all 256 packed bytes (32 rows a scale)."""
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    packed = b.repeat(256, 1).reshape(256 * 32, 8)
    scales = b.repeat_interleave(32).reshape(-1, 1).view(torch.float8_e4m3fn)
    return packed, scales


@pytest.mark.parametrize("g", [1.0, 0.5, 3.0e-3, 2.0**-126, 0.0, float("nan"), float("inf"),
                               torch.tensor(1.0), torch.tensor(-7.25)])
def test_every_byte_and_scale_bit_identical(g) -> None:
    packed, scales = every_byte_by_every_scale()
    assert same_bits(nvfp4_dequantize(packed, scales, g), nibble_decode(packed, scales, g))


def test_pairs_are_low_nibble_first() -> None:
    got = decode_packed_pairs(torch.tensor([[0x21, 0xF8]], dtype=torch.uint8))
    assert got.tolist() == [[0.5, 1.0, -0.0, -6.0]]
    assert str(got[0, 2].item()) == "-0.0"


def test_leading_dims_and_swizzled_layout() -> None:
    torch.manual_seed(0)
    packed = torch.randint(0, 256, (3, 130, 40), dtype=torch.uint8)          # [E, R, K/2], K = 80
    scales = torch.randint(0, 256, (3, 130, 5), dtype=torch.uint8).view(torch.float8_e4m3fn)
    assert same_bits(nvfp4_dequantize(packed, scales, 0.75), nibble_decode(packed, scales, 0.75))
    sw = swizzle_scales(scales[0])
    assert same_bits(nvfp4_dequantize(packed[0], sw, 1.0, scale_layout="swizzled"),
                     nibble_decode(packed[0], scales[0], 1.0))


def test_bad_global_scale_fails_before_decoding() -> None:
    packed, scales = every_byte_by_every_scale()
    with pytest.raises(Exception, match="global_scale"):
        nvfp4_dequantize(packed, scales, torch.ones(2))
    with pytest.raises(Exception, match="global_scale"):
        nvfp4_dequantize(packed, scales, True)
