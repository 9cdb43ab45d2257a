"""Partial interleaved RoPE on the trailing ``qk_rope_head_dim`` dims (spec §5 step 3, §7 step 2, §11).

Pair i of the rope slice is ``(x[2i], x[2i+1])`` (adjacent, complex-pair layout, never the V3.2
half-split layout, spec §16.1), rotated by ``p * omega_i``; the inverse rotation (``-p * omega``) is
applied to the attention output (§5 step 6). Window-only layers use ``rope_theta`` without YaRN;
compressed layers use ``compress_rope_theta`` with the YaRN frequency blend for everything in the
layer (§11). No YaRN attention-magnitude factor anywhere.
"""
from __future__ import annotations

import math

import torch

from ..config import DSV4Config


def yarn_ramp(dim: int, theta: float, factor_len: int, beta_fast: float, beta_slow: float) -> torch.Tensor:
    """``ramp_i`` of spec §11 for pairs i = 0..dim/2-1: 0 keeps omega_i, 1 divides it by the factor."""
    def corr(beta: float) -> float:
        return dim * math.log(factor_len / (2 * math.pi * beta)) / (2 * math.log(theta))

    lo = max(0, math.floor(corr(beta_fast)))
    hi = min(dim - 1, math.ceil(corr(beta_slow)))
    if hi == lo:           # degenerate ramp: a step (the official linear_ramp_factor guard)
        hi += 0.001
    i = torch.arange(dim // 2, dtype=torch.float32)
    return ((i - lo) / (hi - lo)).clamp(0.0, 1.0)


def rope_omega(config: DSV4Config, compressed: bool) -> torch.Tensor:
    """Per-pair angular frequencies (FP32 ``[r/2]``) of a window-only (False) or compressed (True) layer."""
    r = config.qk_rope_head_dim
    theta = config.compress_rope_theta if compressed else config.rope_theta
    omega = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    if not compressed or config.original_seq_len <= 0:   # OFF-M: original_seq_len 0 disables YaRN (§11)
        return omega
    ramp = yarn_ramp(r, theta, config.original_seq_len, config.beta_fast, config.beta_slow)
    return omega / config.rope_factor * ramp + omega * (1.0 - ramp)


class Rope:
    """Rotates the last ``dim`` entries of the last axis; ``positions`` index the first axis of ``x``."""

    def __init__(self, omega: torch.Tensor, dim: int) -> None:
        self.omega = omega
        self.dim = dim

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.to(torch.float32)[:, None] * self.omega.to(positions.device)[None, :]
        return torch.cos(ang), torch.sin(ang)

    def apply(self, x: torch.Tensor, positions: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        """``x [T, ..., d]`` -> same shape and dtype, rope slice rotated by ``+-p * omega`` in FP32."""
        r = self.dim
        cos, sin = self.cos_sin(positions)
        if inverse:
            sin = -sin
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r // 2,)
        cos, sin = cos.reshape(shape), sin.reshape(shape)
        pairs = x[..., -r:].to(torch.float32).unflatten(-1, (r // 2, 2))
        u, v = pairs[..., 0], pairs[..., 1]
        rot = torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2)
        return torch.cat((x[..., :-r], rot.to(x.dtype)), dim=-1)
