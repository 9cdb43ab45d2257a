"""FP4 E2M1 elements: encode (round to nearest, ties to even, saturating), decode, nibble packing.

Code layout (spec nvfp4-and-kernels.md §3.1): bit 3 = sign, bits 2..0 = magnitude index into
{0, 0.5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0. Packing (§3.2): element 2k in the low nibble of byte k,
element 2k+1 in the high nibble.
"""
from __future__ import annotations

import torch

from ._checks import check_dtype, check_float, device_lut, fail

E2M1_MAX = 6.0
E2M1_MAGNITUDES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Value of every code 0..15 (code 8 is -0.0).
E2M1_VALUES: tuple[float, ...] = E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES)

# Decision bounds between neighbouring magnitudes. A value exactly on a bound is a tie and goes to
# the even code: bounds marked True round up (the upper neighbour has the even code), False down.
_BOUNDS: tuple[tuple[float, bool], ...] = (
    (0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False),
)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Round every element of ``x`` to the nearest E2M1 value, ties to the even code -> uint8 codes.

    Magnitudes above 6 (including +-Inf) saturate to +-6. The sign comes from the sign bit, so -0.0
    and negative values that round to zero give code 8 (-0), like an IEEE conversion. E2M1 has no
    NaN: NaN encodes as code 7 (+6, the "satfinite" maximum); block-scaled formats make such blocks
    visible through a NaN scale instead. float16/bfloat16 inputs are compared exactly in float32,
    float64 inputs in float64 (no double rounding).
    """
    check_float(x, "e2m1_encode input")
    v = x if x.dtype == torch.float64 else x.to(torch.float32)
    a = v.abs()
    # The magnitude index counts the bounds that a reaches: one bucketize (right=True counts
    # edges <= a) over edges where a tie-down bound b is replaced by nextafter(b, +inf), since
    # a > b  <=>  a >= nextafter(b) exactly in a's dtype. One kernel instead of 21 (the emulated
    # backend encodes every activation; on a GPU each small kernel costs a launch).
    edges = device_lut(f"e2m1_edges_{v.dtype}", v.device, lambda: _edges(v.dtype))
    mag = torch.bucketize(a, edges, right=True).to(torch.uint8)
    # the sign bit is kept (-0.0 -> code 8); NaN gives code 7 whatever its sign
    mag = torch.where(torch.signbit(v), mag | 0x08, mag)
    return torch.where(torch.isnan(v), torch.full_like(mag, 7), mag)


def _edges(dtype: torch.dtype) -> torch.Tensor:
    """The decision bounds of :data:`_BOUNDS` as ``>=`` edges in ``dtype`` (see :func:`e2m1_encode`)."""
    inf = torch.tensor(float("inf"), dtype=dtype)
    out = [torch.tensor(b, dtype=dtype) if up else torch.nextafter(torch.tensor(b, dtype=dtype), inf)
           for b, up in _BOUNDS]
    return torch.stack(out)


def decode_codes_unchecked(codes: torch.Tensor) -> torch.Tensor:
    """Codes known to be in 0..15 (e.g. from unpacking nibbles) -> float32 values."""
    lut = device_lut("e2m1", codes.device, lambda: torch.tensor(E2M1_VALUES, dtype=torch.float32))
    return lut[codes.long()]


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 -> float32 values (exact; code 8 -> -0.0)."""
    check_dtype(codes, "e2m1_decode codes", torch.uint8)
    if codes.numel() and int(codes.max()) > 15:
        fail("e2m1_decode codes", "values in 0..15", f"max {int(codes.max())}")
    return decode_codes_unchecked(codes)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes ``[..., K]`` (K even, values 0..15) -> uint8 ``[..., K/2]``; code 2k in the low nibble."""
    check_dtype(codes, "pack_nibbles codes", torch.uint8)
    if codes.dim() == 0 or codes.shape[-1] % 2:
        fail("pack_nibbles codes shape", "[..., K] with K even", list(codes.shape))
    if codes.numel() and int(codes.max()) > 15:
        fail("pack_nibbles codes", "values in 0..15", f"max {int(codes.max())}")
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def pack_nibbles_unchecked(codes: torch.Tensor) -> torch.Tensor:
    """:func:`pack_nibbles` for codes known to be in 0..15 (e.g. fresh from :func:`e2m1_encode`):
    no value check, which on a GPU is a host read (a sync) per call."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K/2]`` -> uint8 codes ``[..., K]`` (low nibble first)."""
    check_dtype(packed, "unpack_nibbles packed", torch.uint8)
    if packed.dim() == 0:
        fail("unpack_nibbles packed shape", "[..., K/2]", "a 0-d tensor")
    low, high = packed & 0x0F, packed >> 4
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])
