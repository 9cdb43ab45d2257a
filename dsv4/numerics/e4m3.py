"""FP8 E4M3 (``float8_e4m3fn``): round-to-nearest-even encode with explicit saturation, exact decode.

E4M3: bias 7, 3 mantissa bits, maximum 448, smallest subnormal 2^-9, bytes 0x7F / 0xFF are NaN,
no Inf (spec nvfp4-and-kernels.md §3.3). The encoder never relies on torch's cast, whose saturation
behaviour changed across versions (§4, §7); it works on the float32 bit pattern and exact
power-of-two arithmetic only, so it gives the same bytes on every device.
"""
from __future__ import annotations

import torch

from ._checks import check_dtype, check_float, device_lut

E4M3_MAX = 448.0
E4M3_NAN_BYTE = 0x7F


def pow2_f32(exponent: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for int32 exponents in [-126, 127], built from the bit pattern (exact)."""
    return ((exponent + 127) << 23).to(torch.int32).view(torch.float32)


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """float -> E4M3 bytes (uint8), round to nearest, ties to even.

    Saturating: magnitudes above 448 (including +-Inf) become +-448 (0x7E / 0xFE). NaN -> 0x7F.
    The sign bit is kept (-0.0 -> 0x80). float64 inputs are first rounded to float32.
    """
    check_float(x, "e4m3_encode input")
    v = x.to(torch.float32)
    a = v.abs().clamp(max=E4M3_MAX)  # NaN stays NaN and is replaced below
    # Bytes 0x00..0x7E are the non-negative values in increasing order, so the byte of a is the
    # number of rounding edges at or below it: one bucketize over the 126 midpoints, each moved to
    # nextafter(mid) where the tie belongs to the lower (even) byte. :func:`e4m3_encode_arith` is
    # the same rounding from the bit pattern (the table's check); one kernel instead of a dozen.
    edges = device_lut("e4m3_edges", a.device, _edges)
    mag = torch.bucketize(a, edges, right=True).to(torch.uint8)
    # the sign bit is kept (-0.0 -> 0x80); NaN gives 0x7F whatever its sign
    mag = torch.where(torch.signbit(v), mag | 0x80, mag)
    return torch.where(torch.isnan(v), torch.full_like(mag, E4M3_NAN_BYTE), mag)


def _edges() -> torch.Tensor:
    vals = e4m3_decode_arith(torch.arange(127, dtype=torch.int32).to(torch.uint8))
    mids = (vals[:-1] + vals[1:]) / 2          # exact: at most 5 significant bits
    low_even = (torch.arange(126) % 2) == 0    # a tie between bytes c and c+1 goes to the even one
    return torch.where(low_even, torch.nextafter(mids, torch.full_like(mids, float("inf"))), mids)


def e4m3_encode_arith(x: torch.Tensor) -> torch.Tensor:
    """:func:`e4m3_encode` from the float32 bit pattern with exact power-of-two arithmetic (the
    definition the edges of the table-driven encoder are checked against)."""
    v = x.to(torch.float32)
    a = v.abs().clamp(max=E4M3_MAX)
    # Binade of a: a in [2^(p-1), 2^p). Zero and every fp32 subnormal give p = -126; clamping p to
    # -5 puts everything below 2^-6 into the E4M3 subnormal range, whose quantum is 2^-9.
    p = ((a.view(torch.int32) >> 23) & 0xFF) - 126
    p = torch.clamp(p, min=-5)
    quantum = pow2_f32(p - 4)  # 3 mantissa bits: spacing 2^(p-1-3)
    n = torch.round(a / quantum)  # exact division by a power of two; torch.round is half-to-even
    # Byte = (biased exponent - 1) * 8 + n, with n in [8, 16] for normals (n = 16 carries into the
    # next binade by itself) and n in [0, 8] in the subnormal range (biased exponent 1 there).
    mag = ((p + 5) * 8 + n.to(torch.int32)).to(torch.uint8)
    mag = torch.where(torch.isnan(a), torch.full_like(mag, E4M3_NAN_BYTE), mag)
    sign = (torch.signbit(v) & ~torch.isnan(v)).to(torch.uint8) << 7
    return mag | sign


def e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes (uint8, or a ``float8_e4m3fn`` tensor) -> float32 values (exact; 0x7F/0xFF -> NaN).

    A 256-entry table per device, built once by :func:`e4m3_decode_arith` (one gather per call instead
    of a dozen element-wise kernels: the emulated backend decodes scales on every call)."""
    check_dtype(b, "e4m3_decode input", torch.uint8, torch.float8_e4m3fn)
    u = b if b.dtype == torch.uint8 else b.view(torch.uint8)
    lut = device_lut("e4m3", u.device, lambda: e4m3_decode_arith(torch.arange(256, dtype=torch.int32).to(torch.uint8)))
    return lut[u.long()]


def e4m3_decode_arith(b: torch.Tensor) -> torch.Tensor:
    """The decode from the bit fields (what the table holds)."""
    u = b.to(torch.int32)
    e, m = (u >> 3) & 0xF, u & 0x7
    # normal: 2^(e-7) * (1 + m/8) = (8 + m) * 2^(e-10); subnormal (e = 0): m * 2^-9 = m * 2^(1-10)
    sig = torch.where(e > 0, 8 + m, m).to(torch.float32)
    val = sig * pow2_f32(torch.clamp(e, min=1) - 10)
    val = torch.where((u & 0x7F) == 0x7F, torch.full_like(val, float("nan")), val)
    return torch.where((u & 0x80) != 0, -val, val)


def to_float8_e4m3fn(x: torch.Tensor) -> torch.Tensor:
    """float -> ``torch.float8_e4m3fn`` tensor with the bytes of :func:`e4m3_encode`."""
    return e4m3_encode(x).view(torch.float8_e4m3fn)
