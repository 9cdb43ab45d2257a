"""Host side of the activation-quantization kernels: validation, compile cache, launches.

Shared by the sm_90a and sm_100a backends (``ActQuantRunner(arch)``).
"""
from __future__ import annotations

import torch

from ..contract import ActQuantRequest, FP4Operand, swizzled_numel
from .act_quant import FP32_MIN_NORMAL, ActQuantConfig, ActQuantKernels
from .common import (KernelBuild, KernelCache, capturing, check_align, check_cuda, compile_executor,
                     compile_with_ptx, cu_stream, expect, fake_gmem_ptr, gmem_ptr)

RECIPES = ("exact", "rcp")


def _ptr_types(cfg: ActQuantConfig):
    import cutlass

    w = cutlass.Float32 if cfg.rms_weight_f32 else cutlass.BFloat16
    return cutlass, w


def compile_act_quant(cfg: ActQuantConfig, arch: str, *, keep_ptx: bool = False):
    """-> (amax executor or None, quant executor[, their PTX texts and seconds])."""
    import cuda.bindings.driver as cuda
    cutlass, w = _ptr_types(cfg)
    from cutlass import Float32, Int32

    kern = ActQuantKernels(cfg)
    comp = (lambda *a: compile_with_ptx(*a, arch=arch)) if keep_ptx else (lambda *a: compile_executor(*a, arch=arch))
    amax = None
    if cfg.runtime_scale:
        amax = comp(kern.amax_launch, fake_gmem_ptr(cutlass.BFloat16), fake_gmem_ptr(w),
                    fake_gmem_ptr(cutlass.Uint32, 4), Int32(1), Int32(16), Float32(1e-6), cuda.CUstream(0))
    quant = comp(kern.quant_launch, fake_gmem_ptr(cutlass.BFloat16), fake_gmem_ptr(w),
                 fake_gmem_ptr(Float32, 4), fake_gmem_ptr(cutlass.Uint32, 4), fake_gmem_ptr(cutlass.Uint8, 8),
                 fake_gmem_ptr(cutlass.Uint8, 1), fake_gmem_ptr(Float32, 4), Int32(1), Int32(16),
                 Int32(1), Float32(1e-6), cuda.CUstream(0))
    return amax, quant


def act_quant_builds(arch: str) -> list[KernelBuild]:
    """Pre-flight builds of the activation quantizer for ``arch`` (both recipes, fused RMSNorm +
    runtime scale + swizzled output, and the plain static-scale linear variant)."""
    builds = []
    variants = [("act_quant_exact_static_linear", ActQuantConfig(False, False, False, False, "exact")),
                ("act_quant_rcp_rms_runtime_swizzled", ActQuantConfig(True, False, True, True, "rcp")),
                ("act_quant_exact_rms_f32w_runtime_linear", ActQuantConfig(True, True, True, False, "exact"))]
    forbidden = [r"(div|rcp|sqrt|rsqrt)\.approx", r"cvt\.[a-z0-9.]*e2m1x2"]
    for name, cfg in variants:
        division = r"div\.rn\.f32" if cfg.recipe == "exact" else r"rcp\.rn\.f32"
        required = [division, r"cvt\.rn\.satfinite\.e4m3x2\.f32"]
        try:
            amax, quant = compile_act_quant(cfg, arch, keep_ptx=True)
            _, ptx, secs = quant
            builds.append(KernelBuild(name, arch, ptx, secs, required, forbidden))
            if amax is not None:
                builds.append(KernelBuild(name + ":amax", arch, amax[1], amax[2],
                                          [r"atom\.global\.max\.u32"], forbidden))
        except Exception as e:  # reported by the pre-flight, never swallowed silently
            builds.append(KernelBuild(name, arch, "", 0.0, required, forbidden, error=f"{type(e).__name__}: {e}"))
    return builds


class ActQuantRunner:
    """Validates an ``ActQuantRequest`` and runs the quantizer kernels for one arch."""

    def __init__(self, arch: str):
        self.arch = arch
        self._cache = KernelCache(scope=("act-quant", arch))   # keyed by device below

    def run(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        """``check_values=False`` (implied while capturing a CUDA graph) skips the contract's host
        read of a static global scale."""
        import cutlass

        req.validate(check_values=check_values and not capturing())
        x = req.x
        expect(req.recipe in RECIPES, "recipe", f"one of {RECIPES}", repr(req.recipe))
        check_cuda(x, "x")
        check_align(x, "x", 16)
        w = req.rms_weight
        if w is not None:
            expect(w.dtype in (torch.bfloat16, torch.float32), "rms_weight dtype", "bfloat16 or float32", w.dtype)
            expect(w.is_contiguous(), "rms_weight", "a contiguous tensor", "a strided view")
            check_align(w, "rms_weight", 16)
        g_in = req.global_scale
        m, k = int(x.shape[0]), int(x.shape[1])
        nb = k // 16
        dev = x.device
        packed = torch.empty((m, k // 2), dtype=torch.uint8, device=dev)
        if req.scale_layout == "swizzled":
            scales = torch.empty(swizzled_numel(m, nb), dtype=torch.float8_e4m3fn, device=dev)
        else:
            scales = torch.empty((m, nb), dtype=torch.float8_e4m3fn, device=dev)
        g_out = g_in if g_in is not None else torch.empty((), dtype=torch.float32, device=dev)
        if m == 0:
            if g_in is None:
                g_out.fill_(FP32_MIN_NORMAL)  # the oracle's scale of an empty tensor
            scales.view(torch.uint8).zero_()
            return FP4Operand(packed, scales, g_out, k=k, scale_layout=req.scale_layout)

        cfg = ActQuantConfig(rms=w is not None, rms_weight_f32=w is not None and w.dtype == torch.float32,
                             runtime_scale=g_in is None, swizzled=req.scale_layout == "swizzled",
                             recipe=req.recipe)
        amax_exe, quant_exe = self._cache.get((str(dev), cfg), lambda: compile_act_quant(cfg, self.arch))
        _, wdt = _ptr_types(cfg)
        w_t = w if w is not None else x  # never read without RMSNorm
        stream = cu_stream(dev)
        eps = float(req.rms_eps)
        amax = torch.zeros(1, dtype=torch.int32, device=dev) if g_in is None else g_out.view(1)
        if g_in is None:
            amax_exe(gmem_ptr(x, cutlass.BFloat16), gmem_ptr(w_t, wdt), gmem_ptr(amax, cutlass.Uint32, 4),
                     m, k, eps, stream)
        g_src = g_in if g_in is not None else g_out
        grid_rows = -(-m // 128) * 128 if cfg.swizzled else m
        quant_exe(gmem_ptr(x, cutlass.BFloat16), gmem_ptr(w_t, wdt), gmem_ptr(g_src, cutlass.Float32, 4),
                  gmem_ptr(amax, cutlass.Uint32, 4), gmem_ptr(packed, cutlass.Uint8, 8),
                  gmem_ptr(scales, cutlass.Uint8, 1), gmem_ptr(g_out, cutlass.Float32, 4),
                  m, k, grid_rows, eps, stream)
        return FP4Operand(packed, scales, g_out, k=k, scale_layout=req.scale_layout)
