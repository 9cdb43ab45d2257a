"""The ``emulated`` backend: the executable definition of the kernel contract (contract.py).

GEMM: both operands dequantized exactly to ``e2m1 * e4m3`` (exact in BF16/FP32, spec
nvfp4-and-kernels.md §6), an FP32 matmul (FP32 accumulation), ``alpha`` applied in FP32 after the
product, the optional SwiGLU epilogue in FP32, output BF16. The only roundings are the FP32
accumulation, the multiply by alpha, the epilogue and the BF16 cast, so a correct native kernel
matches this backend to FP32 accumulation order (about 1 BF16 ulp after the output cast). TF32
matmul settings do not change that: the dequantized operands have <= 6 significant bits, exact in TF32.
Activation quantization is :func:`dsv4.numerics.nvfp4_quantize` with the request's recipe, after an
optional RMSNorm in FP32. Runs on whatever device the request's tensors are on.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.numerics import (RECIPES, check_global_scale, nvfp4_dequantize, nvfp4_quantize, swizzle_scales,
                           swizzled_numel, unswizzle_scales)

from .contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest, KernelContractError
from .registry import register_backend


def _block_dequant(packed: torch.Tensor, scales: torch.Tensor, layout: str) -> torch.Tensor:
    """``e2m1 * e4m3`` in FP32 without the global scale (multiplying by 1.0 is exact)."""
    return nvfp4_dequantize(packed, scales, 1.0, scale_layout=layout)


_DECODED = None


def _weight_dequant(packed: torch.Tensor, scales: torch.Tensor, layout: str, extra: object = None,
                    build=None) -> torch.Tensor:
    """``_block_dequant`` of a weight operand through the process's :class:`DecodeCache`."""
    global _DECODED
    if _DECODED is None:
        from .emulated_cache import DecodeCache

        _DECODED = DecodeCache()
    return _DECODED.get(packed, scales, (layout, extra),
                        build or (lambda: _block_dequant(packed, scales, layout)))


def _epilogue(y: torch.Tensor, swiglu_limit: float | None) -> torch.Tensor:
    """FP32 ``alpha * acc`` -> BF16, through ``silu(min(gate, L)) * clamp(up, -L, L)`` when fused."""
    if swiglu_limit is None:
        return y.to(torch.bfloat16)
    n = y.shape[-1] // 2
    gate = torch.clamp(y[..., :n], max=swiglu_limit)  # the sigmoid reads the CLAMPED gate
    up = torch.clamp(y[..., n:], min=-swiglu_limit, max=swiglu_limit)
    return (F.silu(gate) * up).to(torch.bfloat16)


class EmulatedBackend:
    """Pure-torch NVFP4 backend built on :mod:`dsv4.numerics`; every method validates first."""

    name = "emulated"

    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        a = _block_dequant(req.a.packed, req.a.scales, req.a.scale_layout)
        b = _weight_dequant(req.b.packed, req.b.scales, req.b.scale_layout)
        alpha = req.a.global_scale * req.b.global_scale  # FP32 product, as a kernel forms it
        return _epilogue((a @ b.T) * alpha, req.swiglu_limit)

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor:
        req.validate(check_values=check_values)
        e_count, n = req.num_experts, req.n_per_expert
        sc = req.b.k // 16
        a = _block_dequant(req.a.packed, req.a.scales, req.a.scale_layout)
        offsets = req.offsets.to("cpu").tolist()
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=req.a.device)
        per_expert = swizzled_numel(n, sc)
        for e in range(e_count):
            lo, hi = offsets[e], offsets[e + 1]
            if lo == hi:  # empty experts are allowed and cost nothing
                continue
            b = _weight_dequant(req.b.packed, req.b.scales, req.b.scale_layout, (e, n),
                                lambda e=e: _expert_dequant(req, e, n, sc, per_expert))
            out[lo:hi] = _epilogue((a[lo:hi] @ b.T) * req.alphas[e], req.swiglu_limit)
        return out

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        req.validate(check_values=check_values)
        if req.recipe not in RECIPES:
            raise KernelContractError(f"recipe: expected one of {RECIPES}, found {req.recipe!r}")
        if req.global_scale is not None:
            try:
                check_global_scale(req.global_scale)  # one host read; finite and >= 2^-126
            except ValueError as e:
                raise KernelContractError(str(e)) from None
        x = req.x.to(torch.float32)
        if req.rms_weight is not None:
            x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + req.rms_eps) * req.rms_weight.to(torch.float32)
        packed, scales, g_out = nvfp4_quantize(x, req.global_scale, recipe=req.recipe)
        if req.scale_layout == "swizzled":
            scales = swizzle_scales(scales)
        return FP4Operand(packed, scales, g_out, k=int(req.x.shape[1]), scale_layout=req.scale_layout)


def _expert_dequant(req: GroupedGemmRequest, e: int, n: int, sc: int, per_expert: int) -> torch.Tensor:
    packed = req.b.packed[e * n:(e + 1) * n]
    if req.b.scale_layout == "swizzled":  # swizzled per expert, experts back to back
        scales = unswizzle_scales(req.b.scales[e * per_expert:(e + 1) * per_expert], n, sc)
    else:
        scales = req.b.scales[e * n:(e + 1) * n]
    return _block_dequant(packed, scales, "linear")


def _factory(device: torch.device) -> EmulatedBackend:
    return EmulatedBackend()


def register() -> None:
    """Entry point (group ``dsv4_parity.backends``): the registry calls it, never imports this module."""
    register_backend("emulated", _factory, supports=lambda d: True, priority=0)
