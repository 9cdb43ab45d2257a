"""Fake quantization with the rounding of the official kernels (spec §12, OFF-K `act_quant_kernel`,
`fp4_quant_kernel`, `fast_round_scale`), and the normalized Walsh-Hadamard rotation (§7 step 3).

"Fake" = quantize and dequantize in one step: per block a power-of-two (UE8M0) scale
``s = 2^ceil(log2(amax * (1/qmax)))``, ``x/s`` clamped to ±qmax, rounded to E4M3 or E2M1, times s,
stored back in the input dtype. Unlike the pure-torch fallback of some mirrors this really rounds.
"""
from __future__ import annotations

import math

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
FP8_AMAX_FLOOR = 1e-4                 # OFF-K act_quant_kernel
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126    # OFF-K fp4_quant_kernel
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """§12 UE8M0 scale: ``2^ceil(log2(amax * fp32(1/qmax)))``; an exact power of two is kept.

    OFF-K multiplies by the fp32 reciprocal (not a division) and reads ceil(log2) from the fp32 bits:
    exponent, plus one unless the mantissa is zero. frexp gives m in [0.5, 1): a power of two has m = 0.5.
    """
    t = amax.float() * torch.tensor(1.0 / qmax, dtype=torch.float32, device=amax.device)
    m, e = torch.frexp(t)
    e = e - (m == 0.5).to(e.dtype)
    return torch.ldexp(torch.ones_like(t), e)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"fake quantization: last dim {n} is not a multiple of the block size {block}")
    return x.float().reshape(*x.shape[:-1], n // block, block)


def fake_quant_fp8(x: torch.Tensor, block: int) -> torch.Tensor:
    """§12 FP8 E4M3 fake quantization along the last dim in blocks of ``block`` (128 for GEMM
    activations, 64 for the kv nope dims)."""
    xb = _blocks(x, block)
    s = pow2_scale(xb.abs().amax(-1, keepdim=True).clamp_min(FP8_AMAX_FLOOR), FP8_MAX)
    # torch's float8 cast rounds to nearest even; the explicit clamp makes saturation independent of it.
    q = (xb / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s
    return q.reshape(x.shape).to(x.dtype)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values in [-6, 6] to the E2M1 grid, nearest with ties to the even code."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=v.device)
    a = v.float().abs().clamp(max=FP4_MAX).contiguous()
    hi = torch.searchsorted(grid, a).clamp(max=len(E2M1_GRID) - 1)   # first grid value >= a
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - grid[lo], grid[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    return torch.copysign(torch.where(take_hi, grid[hi], grid[lo]), v.float())


def fake_quant_fp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """§12 FP4 E2M1 fake quantization (indexer q and keys), block 32, UE8M0 scale."""
    xb = _blocks(x, block)
    s = pow2_scale(xb.abs().amax(-1, keepdim=True).clamp_min(FP4_AMAX_FLOOR), FP4_MAX)
    q = round_e2m1((xb / s).clamp(-FP4_MAX, FP4_MAX)) * s
    return q.reshape(x.shape).to(x.dtype)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Sylvester Walsh-Hadamard transform of the last dim, scaled by n^-1/2 (§7 step 3); computed in
    fp32 by butterflies and returned in x's dtype (OFF-M rotate_activation on bf16)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"hadamard: last dim {n} is not a power of two")
    y = x.float()
    h = 1
    while h < n:
        y = y.reshape(*x.shape[:-1], n // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return (y.reshape(x.shape) * (1.0 / math.sqrt(n))).to(x.dtype)
