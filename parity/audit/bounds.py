"""Analytic error bounds of one NVFP4 kernel call against the bit-faithful oracle (docs/audit.md).

GEMM. Both operands dequantize exactly (``e2m1 * e4m3`` has <= 6 significant bits), so every product
``a[m,k] * b[n,k]`` is exact in FP32 and the only freedom a correct kernel has is the order (and the
rounding direction) of its FP32 accumulation. For any order, recursive or blocked, rounded or
truncated, ``|acc_kernel - acc_exact| <= gamma_K * S`` with ``S = sum_k |a b|`` and
``gamma_K = K u / (1 - K u)``, ``u = 2^-23`` (the unit roundoff of round-toward-zero, which also
covers round-to-nearest's 2^-24; tensor cores truncate inside their adders). The oracle accumulates in
FP32 too, so the bound between the two is ``2 gamma_K S``. Then come the FP32 multiply by alpha (one
rounding on each side), the optional SwiGLU epilogue (``silu`` is 1.1-Lipschitz, ``clamp`` 1-Lipschitz;
fast-math ``exp``/reciprocal are given ``2^-19`` relative) and the BF16 output cast (half a BF16 ulp of
the value). The result is a per-element bound: elements with a large ``S`` get a large bound, zero
rows get zero.

Activation quantization. Without a fused RMSNorm every step is one IEEE operation in both the oracle and
a correct kernel, so codes, block scales and the global scale must be bit-identical. With a fused
RMSNorm the normalized value differs between implementations by at most ``delta_norm`` relative (the
sum of squares, the rsqrt, two multiplies, on both sides); a code or a scale may then differ from the
oracle's only where the oracle's pre-rounding value lies within that bound of a rounding boundary, i.e.
the kernel's value must lie in ``[round(v (1 - d)), round(v (1 + d))]`` (rounding is monotone).
"""
from __future__ import annotations

import torch

U_ACC = 2.0 ** -23          # FP32 accumulation, truncating adders included
U32 = 2.0 ** -24            # one IEEE FP32 rounding (round to nearest)
SILU_LIPSCHITZ = 1.1        # max |d silu / dx| = 1.0998...
EPILOGUE_REL = 2.0 ** -19   # fast-math exp / reciprocal / two multiplies of the SwiGLU epilogue
RSQRT_REL = 2.0 ** -21      # rsqrt.approx.f32 (and a correctly rounded rsqrt) relative error


def gamma(n: int, u: float = U_ACC) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of an n-term floating-point sum."""
    nu = n * u
    if nu >= 1:
        raise ValueError(f"gamma: n * u must be < 1, found {n} * {u}")
    return nu / (1 - nu)


def half_ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    """Half a BF16 ulp at ``|x|`` (float64), 0 at 0: the most a correctly rounded BF16 cast moves a value."""
    a = x.abs().to(torch.float64)
    _, ex = torch.frexp(a)                        # a = m 2^ex, m in [0.5, 1): floor(log2 a) = ex - 1
    e = torch.clamp(ex.to(torch.float64) - 1, min=-126)
    h = torch.pow(2.0, e - 8)
    return torch.where(a > 0, h, torch.zeros_like(h))


def accumulation_bound(k: int, abs_acc: torch.Tensor) -> torch.Tensor:
    """Kernel vs oracle FP32 accumulation of K exact products with ``S = abs_acc``. ``abs_acc`` is itself
    an FP32 sum of non-negative terms, low by at most gamma_K relative, hence the (1 + gamma) factor."""
    g = gamma(k + 1)
    return 2.0 * g * (1.0 + g) * abs_acc.to(torch.float64)


def swiglu_bound(pre: torch.Tensor, err: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's SwiGLU output (float64) and its bound from the pre-activation error ``err``."""
    n = pre.shape[-1] // 2
    g, u = pre[..., :n].to(torch.float64), pre[..., n:].to(torch.float64)
    eg, eu = err[..., :n], err[..., n:]
    gc = torch.clamp(g, max=limit)
    uc = torch.clamp(u, min=-limit, max=limit)
    silu = gc * torch.sigmoid(gc)
    out = silu * uc
    bound = SILU_LIPSCHITZ * eg * (uc.abs() + eu) + silu.abs() * eu + EPILOGUE_REL * out.abs()
    return out, bound


def rmsnorm_delta(k: int) -> float:
    """Relative difference bound of an FP32 RMSNorm between two implementations: the K-term sum of
    squares (gamma_K), its rsqrt (halves the relative error, plus the rsqrt's own), the two multiplies
    by the rsqrt and the weight; twice (both sides may err in opposite directions)."""
    return 2.0 * (gamma(k) / 2 + RSQRT_REL + 3 * U32)


def monotone_interval(values: torch.Tensor, delta: float, round_fn) -> tuple[torch.Tensor, torch.Tensor]:
    """``[round(v (1 - delta)), round(v (1 + delta))]`` sorted per element (a negative v flips them)."""
    lo = round_fn(values * (1.0 - delta))
    hi = round_fn(values * (1.0 + delta))
    return torch.minimum(lo, hi), torch.maximum(lo, hi)
