"""Small shared operations: RMS norms, the linear, and the accumulation rule.

Accumulation rule: every transcendental function and every product-sum whose length or batching changes with the call (a linear over
T tokens vs one decode token, a softmax over the keys a query sees) accumulates in fp64 and is
rounded once to the dtype the spec prescribes (fp32 islands of §12, or the activation dtype). fp32
accumulation order depends on the kernel the shape selects, and under fake quantization a last-bit
difference can cross a rounding boundary; with fp64 sums the rounded results do not depend on the
batch, so decode reproduces a longer prefill exactly (see tests/reference/test_model.py)."""
from __future__ import annotations

import torch

from .fakequant import fake_quant_fp8

ACC = torch.float64
GEMM_ACT_BLOCK = 128   # §12 row 1: per token, 128 elements per FP8 scale


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated in fp64 (the caller rounds)."""
    return a.to(ACC) @ b.to(ACC)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """fp32 sigmoid evaluated in fp64: torch's vectorized and scalar fp32 kernels can differ in the
    last bit, which would make a value depend on how many elements the tensor holds."""
    return torch.sigmoid(x.to(ACC)).float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Weighted RMSNorm (OFF-M RMSNorm): fp32 normalization and weight product, cast back once."""
    xf = x.float()
    r = torch.rsqrt(xf.to(ACC).square().mean(-1, keepdim=True) + eps).float()
    return (weight.float() * (xf * r)).to(x.dtype)


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """§5 step 1 per-head norm without a weight; one rounding to x's dtype."""
    xf = x.float()
    r = torch.rsqrt(xf.to(ACC).square().mean(-1, keepdim=True) + eps).float()
    return (xf * r).to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor, quant_input: bool = False) -> torch.Tensor:
    """y = x·Wᵀ rounded to x's dtype. ``quant_input``: the official FP8 GEMM's activation
    quantization (§12 row 1) is applied to x first."""
    if quant_input:
        x = fake_quant_fp8(x, GEMM_ACT_BLOCK)
    return mm(x, w.T).to(x.dtype)
