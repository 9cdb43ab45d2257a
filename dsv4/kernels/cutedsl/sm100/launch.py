"""Compiling the sm_100a kernel (for launch, or compile-only with PTX kept) and launching it.

Imports ``cutlass``: only the backend's launch path and ``compile_for_check`` load this module.
Compilation takes fake pointers and runtime ``Int32`` sizes, so one executor serves every problem
shape of its ``KernelConfig``; no GPU or driver call happens while compiling.
"""
from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass

from ..common import compile_executor, compile_with_ptx, cu_stream, fake_gmem_ptr, gmem_ptr
from .kernel import AB_DTYPE, C_DTYPE, SF_DTYPE, Nvfp4BlockScaledGemm
from .layout import TMA_ALIGN_BYTES, KernelConfig

# (dtype, alignment the kernel is compiled to assume) of a, b, sfa, sfb, out, alpha, sched; the
# host wrapper checks the TMA ones (layout.launch_problems) before every launch.
_PTR_SPECS = ((AB_DTYPE, TMA_ALIGN_BYTES), (AB_DTYPE, TMA_ALIGN_BYTES), (SF_DTYPE, TMA_ALIGN_BYTES),
              (SF_DTYPE, TMA_ALIGN_BYTES), (C_DTYPE, 2), (cutlass.Float32, 4), (cutlass.Int32, 4))


def compile_kernel(cfg: KernelConfig, arch: str = "sm_100a", *, keep_ptx: bool = False):
    """``cute.compile`` one configuration for ``arch``: ``(executor, ptx, seconds)`` with
    ``keep_ptx``, else the executor alone."""
    kernel = Nvfp4BlockScaledGemm(cfg.bn, swiglu=cfg.swiglu, grouped=cfg.grouped)
    args = (*(fake_gmem_ptr(dt, al) for dt, al in _PTR_SPECS), *(cutlass.Int32(1) for _ in range(5)),
            cutlass.Float32(1.0), cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(kernel, *args, arch=arch)
    return compile_executor(kernel, *args, arch=arch)


def launch(exe, args) -> None:
    """Launch ``args`` (a ``backend.LaunchArgs``) on the current torch stream of its device."""
    tensors = (args.a, args.b, args.sfa, args.sfb, args.out, args.alpha, args.sched)
    ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, _PTR_SPECS)]
    exe(*ptrs, args.m, args.nb, args.k, args.lb, args.num_work, args.swiglu_limit, cu_stream(args.out.device))
