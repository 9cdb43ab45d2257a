"""E4M3 encode/decode against torch's float8_e4m3fn conversion (where it is defined the same way)
and UE8M0 decode (spec nvfp4-and-kernels.md §3.3, §4)."""
from __future__ import annotations

import torch

from dsv4.numerics import e4m3_decode, e4m3_encode, to_float8_e4m3fn, ue8m0_decode


def torch_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal including the sign of zero, NaN == NaN."""
    nan = torch.isnan(a) & torch.isnan(b)
    eq = (a == b) & (torch.signbit(a) == torch.signbit(b))
    return bool((nan | eq).all())


def test_decode_every_byte_matches_torch() -> None:
    u = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert same_values(e4m3_decode(u), u.view(torch.float8_e4m3fn).float())
    assert torch.isnan(e4m3_decode(torch.tensor([0x7F, 0xFF], dtype=torch.uint8))).all()
    assert e4m3_decode(torch.tensor([0x7E, 0x01, 0x08], dtype=torch.uint8)).tolist() == [448.0, 2 ** -9, 2 ** -6]


def test_encode_every_in_range_bfloat16_matches_torch() -> None:
    # Exhaustive over bf16 bit patterns with |x| <= 448 (where torch's cast needs no saturation).
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = x[~torch.isnan(x) & (x.abs() <= 448)]
    assert torch.equal(e4m3_encode(x), torch_e4m3_bytes(x))


def test_encode_midpoints_and_their_neighbours_match_torch() -> None:
    # Every tie between consecutive E4M3 values, and one float32 ulp either side of it.
    pos = e4m3_decode(torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8))
    mid = (pos[:-1] + pos[1:]) / 2  # exact in float32
    x = torch.cat([mid, torch.nextafter(mid, torch.zeros_like(mid)), torch.nextafter(mid, torch.full_like(mid, 1e4))])
    x = torch.cat([x, -x])
    assert torch.equal(e4m3_encode(x), torch_e4m3_bytes(x))
    # ties go to the even mantissa: 1 + 1/16 -> 1.0, 1 + 3/16 -> 1.25 (spec §4)
    assert e4m3_decode(e4m3_encode(torch.tensor([1.0625, 1.1875]))).tolist() == [1.0, 1.25]


def test_encode_random_float32_matches_torch_including_subnormals() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g) * torch.exp2(torch.randint(-30, 10, (200_000,), generator=g).float())
    x = torch.cat([x.clamp(-448, 448), torch.tensor([1e-45, -1e-40, 2 ** -10, 2 ** -10 * 1.0001, 0.0, -0.0])])
    assert torch.equal(e4m3_encode(x), torch_e4m3_bytes(x))


def test_encode_saturates_explicitly_and_keeps_nan() -> None:
    x = torch.tensor([449.0, 464.0, 1e9, float("inf"), -500.0, float("-inf"), float("nan")])
    assert e4m3_encode(x).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x7F]
    assert to_float8_e4m3fn(x).dtype == torch.float8_e4m3fn


def test_ue8m0_decode_every_byte() -> None:
    u = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = ue8m0_decode(u)
    want = torch.tensor([2.0 ** (e - 127) for e in range(255)], dtype=torch.float64)
    assert torch.equal(got[:255].double(), want)  # exact powers of two, 2^-127 (fp32 subnormal) included
    assert torch.isnan(got[255])
    # torch's own e8m0 dtype reads the same bytes the same way
    assert same_values(got, u.view(torch.float8_e8m0fnu).float())
    assert same_values(ue8m0_decode(u.view(torch.float8_e8m0fnu)), got)


def test_table_encoder_equals_the_bit_pattern_definition() -> None:
    """The bucketize encoder (126 edges) against the exact power-of-two arithmetic it replaced, on every
    257th float32 bit pattern of both signs (infinities, NaNs and subnormals included) and each edge's
    neighbours."""
    from dsv4.numerics.e4m3 import _edges, e4m3_encode_arith

    xs = torch.arange(0, 2**31 - 1, 257, dtype=torch.int64).to(torch.int32).view(torch.float32)
    e = _edges()
    near = torch.cat([e, torch.nextafter(e, torch.zeros_like(e)), torch.nextafter(e, torch.full_like(e, 1e9))])
    for x in (xs, -xs, near, -near):
        assert torch.equal(e4m3_encode(x), e4m3_encode_arith(x))
