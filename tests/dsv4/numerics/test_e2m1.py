"""E2M1 element encode/decode and nibble packing (spec nvfp4-and-kernels.md §3.1, §3.2)."""
from __future__ import annotations

import math

import pytest
import torch

from dsv4.numerics import E2M1_VALUES, e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles

MAGS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def brute_force_code(v: float) -> int:
    """Independent reference: nearest magnitude by distance, ties to the even code, saturate at 6."""
    sign = 8 if math.copysign(1.0, v) < 0 else 0
    a = min(abs(v), 6.0)
    d = [abs(a - m) for m in MAGS]
    best = min(d)
    cands = [i for i, di in enumerate(d) if di == best]
    mag = cands[0] if len(cands) == 1 else next(i for i in cands if i % 2 == 0)
    return sign | mag


def test_decode_table_is_the_spec_table() -> None:
    vals = e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert vals.tolist() == [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
    assert torch.signbit(vals[8])  # code 8 is -0, not +0
    assert list(E2M1_VALUES) == vals.tolist()


@pytest.mark.parametrize("tie,lower,upper,even_code", [
    (0.25, 0, 1, 0), (0.75, 1, 2, 2), (1.25, 2, 3, 2), (1.75, 3, 4, 4), (2.5, 4, 5, 4), (3.5, 5, 6, 6), (5.0, 6, 7, 6)])
def test_every_tie_rounds_to_the_even_code(tie: float, lower: int, upper: int, even_code: int) -> None:
    x = torch.tensor([tie, -tie], dtype=torch.float32)
    assert e2m1_encode(x).tolist() == [even_code, even_code | 8]
    # one float32 ulp either side leaves the tie: below -> the lower neighbour, above -> the upper
    below = torch.nextafter(x, torch.zeros_like(x))
    above = torch.nextafter(x, 2 * x)
    assert e2m1_encode(below).tolist() == [lower, lower | 8]
    assert e2m1_encode(above).tolist() == [upper, upper | 8]


def test_every_bfloat16_value_matches_the_brute_force_reference() -> None:
    # Exhaustive over all 2^16 bf16 bit patterns (NaNs excluded; they are tested separately).
    x = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[~torch.isnan(x)]
    got = e2m1_encode(x).tolist()
    want = [brute_force_code(v) for v in x.float().tolist()]
    assert got == want


def test_float64_input_is_not_double_rounded() -> None:
    # 0.25 + 2^-40 rounds to 0.25 in float32 (a tie -> code 0) but is above the bound in float64.
    assert e2m1_encode(torch.tensor([0.25 + 2 ** -40], dtype=torch.float64)).tolist() == [1]


def test_saturation_signed_zero_and_nan() -> None:
    x = torch.tensor([7.0, -1e30, float("inf"), float("-inf"), -0.0, -0.1, 0.1, float("nan")])
    assert e2m1_encode(x).tolist() == [7, 15, 7, 15, 8, 8, 0, 7]


def test_decode_rejects_codes_above_15() -> None:
    with pytest.raises(ValueError, match="0..15"):
        e2m1_decode(torch.tensor([16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        e2m1_decode(torch.tensor([1], dtype=torch.int32))


def test_packing_order_low_nibble_first() -> None:
    codes = torch.tensor([[1, 2, 15, 0, 7, 8]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x21, 0x0F, 0x87]]
    assert unpack_nibbles(torch.tensor([0x21, 0x0F, 0x87], dtype=torch.uint8)).tolist() == [1, 2, 15, 0, 7, 8]


def test_unpack_then_pack_is_identity_on_every_byte() -> None:
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(4, 64)
    assert torch.equal(pack_nibbles(unpack_nibbles(b)), b)


def test_pack_validates_its_input() -> None:
    with pytest.raises(ValueError, match="K even"):
        pack_nibbles(torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="0..15"):
        pack_nibbles(torch.tensor([16, 0], dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        unpack_nibbles(torch.zeros(2, dtype=torch.int8))
