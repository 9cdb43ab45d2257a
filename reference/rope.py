"""RoPE (spec §5 step 3, §11): interleaved pairs on the trailing ``qk_rope_head_dim`` dims, θ and
YaRN per layer kind, computed on the fly for the positions at hand (no table, no global state)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsv4.config import DSV4Config


@dataclass(frozen=True)
class Yarn:
    factor: float
    original_seq_len: int
    beta_fast: float
    beta_slow: float


@dataclass(frozen=True)
class RopeSpec:
    dim: int
    theta: float
    yarn: Yarn | None


def rope_spec(config: DSV4Config, layer_kind: str) -> RopeSpec:
    """§11: window-only layers use rope_theta without YaRN; compressed layers (CSA/HCA) use
    compress_rope_theta + YaRN for everything in the layer (q, kv, compressed kv, indexer q and keys).
    OFF-M disables YaRN when original_seq_len is 0; no mscale in any case."""
    if layer_kind == "window":
        return RopeSpec(config.qk_rope_head_dim, config.rope_theta, None)
    yarn = None
    if config.original_seq_len > 0:
        yarn = Yarn(config.rope_factor, config.original_seq_len, config.beta_fast, config.beta_slow)
    return RopeSpec(config.qk_rope_head_dim, config.compress_rope_theta, yarn)


def inv_freq(spec: RopeSpec) -> torch.Tensor:
    """ω_i = θ^(-2i/dim), blended by the YaRN ramp of §11 (OFF-M precompute_freqs_cis), fp32."""
    dim = spec.dim
    freqs = 1.0 / (spec.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    y = spec.yarn
    if y is None:
        return freqs

    def corr(rotations: float) -> float:
        return dim * math.log(y.original_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(spec.theta))

    lo = max(math.floor(corr(y.beta_fast)), 0)
    hi = min(math.ceil(corr(y.beta_slow)), dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
    smooth = 1 - ramp
    return freqs / y.factor * (1 - smooth) + freqs * smooth


def cos_sin(spec: RopeSpec, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of the fp32 angles p·ω_i, fp32 [len(positions), dim/2]."""
    ang = torch.outer(positions.to(torch.float32), inv_freq(spec).to(positions.device)).double()
    return torch.cos(ang).float(), torch.sin(ang).float()   # fp64 kernels: batch-invariant (ops.py)


def apply_rope(x: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor], inverse: bool = False) -> torch.Tensor:
    """Rotate the trailing rope dims of ``x`` [T, ..., d] by +p·ω (or −p·ω when ``inverse``, §5 step 6).

    Pair (u, v) = (x[d-r+2i], x[d-r+2i+1]): u' = u cos − v sin, v' = u sin + v cos, in fp32, cast back."""
    cos, sin = cs
    if inverse:
        sin = -sin
    r = 2 * cos.shape[-1]
    view = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.reshape(view), sin.reshape(view)
    rope = x[..., -r:].float().unflatten(-1, (-1, 2))
    u, v = rope[..., 0], rope[..., 1]
    out = torch.stack((u * cos - v * sin, u * sin + v * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-r], out.to(x.dtype)), dim=-1)
