"""UE8M0 power-of-two scales and the official ``fast_round_scale`` rule.

A UE8M0 byte e means 2^(e-127); byte 255 is NaN (spec dsv4-architecture.md §2.3). The official
quantizers (inference/kernel.py, spec §12) pick the scale ``2^ceil(log2(amax * (1/max)))`` with the
product and the reciprocal rounded to float32 and the ceil-log2 read off the bit pattern
(``fast_log2_ceil``): an exact power of two is kept, anything else rounds up. Because float32 1/6 and
1/448 are both rounded *up*, the chosen scale always satisfies ``amax <= max * scale`` (no clipping).
"""
from __future__ import annotations

import torch

from ._checks import as_bytes
from .e4m3 import pow2_f32

UE8M0_BIAS = 127
UE8M0_NAN_BYTE = 255


def ue8m0_decode(b: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes (uint8 or ``float8_e8m0fnu``) -> float32 2^(e-127) (exact; byte 0 is 2^-127, 255 NaN)."""
    e = as_bytes(b, "ue8m0_decode input", torch.float8_e8m0fnu).to(torch.int32)
    val = pow2_f32(torch.clamp(e, min=1) - UE8M0_BIAS)
    val = torch.where(e == 0, torch.full_like(val, 2.0 ** -127), val)
    return torch.where(e == UE8M0_NAN_BYTE, torch.full_like(val, float("nan")), val)


def pow2_ceil_exponent(amax: torch.Tensor, max_value: float, amax_floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The official scale exponent ``k = ceil(log2(max(amax, floor) * fl32(1/max_value)))``.

    ``amax`` is float32 >= 0. The floor keeps the product a normal float32 (the bit-level ceil-log2
    is only valid there). Returns ``(k int32, finite bool)``; where ``amax`` is NaN or Inf, ``k`` is
    meaningless and ``finite`` is False (callers emit a NaN scale there).
    """
    # fp32-rounded 1/max, filled on the device (a torch.tensor(..., device=) is a synchronizing copy)
    inv = torch.full((), 1.0 / max_value, dtype=torch.float32, device=amax.device)
    finite = torch.isfinite(amax)
    a = torch.where(finite, amax, torch.zeros_like(amax)).clamp(min=amax_floor)
    y = a * inv
    bits = y.view(torch.int32)
    k = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return k.to(torch.int32), finite
