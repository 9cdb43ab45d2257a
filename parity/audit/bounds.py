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
    """Half a BF16 ulp at ``|x|`` (float32), 0 at 0: the most a correctly rounded BF16 cast moves a value.
    The power of two of ``|x|``'s binade comes straight from its FP32 exponent bits (a value rounded up
    into the next binade only loosens the bound); below the normal range the BF16 quantum is 2^-133."""
    a = x.abs().to(torch.float32)
    binade = (a.view(torch.int32) & 0x7F800000).view(torch.float32)     # 2^floor(log2 a), 0 for subnormals
    h = torch.clamp(binade, min=2.0 ** -126) * 2.0 ** -8
    return torch.where(a > 0, h, torch.zeros_like(h))


# The bounds are themselves computed in FP32: a relative slack far above FP32's 2^-24 covers their own
# rounding, so an element exactly at its bound is never misjudged by the bound's arithmetic.
BOUND_SLACK = 1.0 + 2.0 ** -16


def accumulation_bound(k: int, abs_acc: torch.Tensor) -> torch.Tensor:
    """Kernel vs oracle FP32 accumulation of K exact products with ``S = abs_acc``. ``abs_acc`` is itself
    an FP32 sum of non-negative terms, low by at most gamma_K relative, hence the (1 + gamma) factor."""
    g = gamma(k + 1)
    return (2.0 * g * (1.0 + g) * BOUND_SLACK) * abs_acc.to(torch.float32)


def swiglu_bound(pre: torch.Tensor, err: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's SwiGLU output (FP32) and its bound from the pre-activation error ``err`` (the
    oracle's own FP32 epilogue rounding is inside EPILOGUE_REL, which covers both sides)."""
    n = pre.shape[-1] // 2
    g, u = pre[..., :n].to(torch.float32), pre[..., n:].to(torch.float32)
    eg, eu = err[..., :n], err[..., n:]
    gc = torch.clamp(g, max=limit)
    uc = torch.clamp(u, min=-limit, max=limit)
    silu = gc * torch.sigmoid(gc)
    out = silu * uc
    bound = SILU_LIPSCHITZ * eg * (uc.abs() + eu) + silu.abs() * eu + (2 * EPILOGUE_REL) * out.abs()
    return out, bound * BOUND_SLACK


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
