"""Compile-only pre-flight of every sm_100a kernel configuration (no GPU needed; spec §1.4).

``compile_for_check()`` compiles each ``layout.CONFIGS`` entry with fake pointers for sm_100a, keeps
the PTX, and returns one ``KernelBuild`` per configuration with the PTX patterns that prove the kernel
is the real block-scaled NVFP4 MMA (and not, say, an MX or 16-bit fallback).
"""
from __future__ import annotations

import time

from ..common import KernelBuild
from .layout import CONFIGS, KernelConfig

ARCH = "sm_100a"

# What every configuration must contain.
REQUIRED = [
    r"\.target\s+sm_100a",
    # the block-scaled FP4 MMA: E2M1 x E2M1 with UE4M3 scales ...
    r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale",
    # ... one scale per 16 elements (PTX spells scale_vec::4X as .block16 in newer ISAs)
    r"tcgen05\.mma[^;]*(\.block16|scale_vec::4X)",
    r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4",  # scale factors SMEM -> TMEM
    r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global",  # TMA loads
    r"tcgen05\.ld\.sync\.aligned\.32x32b",  # accumulator TMEM -> registers
    r"tcgen05\.wait::ld",  # ... completed before the TMEM is released
    r"cvt\.rn\.bf16(x2)?\.f32",  # BF16 output, round to nearest even
    r"tcgen05\.alloc", r"tcgen05\.dealloc",
]
FORBIDDEN = [
    r"wgmma",  # Hopper MMA: would not run on sm_100 and is not the block-scaled path
    r"kind::f16|kind::tf32|kind::f8f6f4|kind::mxf8f6f4|kind::mxf4\.",  # wrong MMA kinds
    r"scale_vec::[12]X|\.block32",  # MX-style 32-element scale blocks
]
SWIGLU_REQUIRED = [r"ex2\.approx", r"div\.rn\.f32"]  # the sigmoid of the clamped gate
PLAIN_FORBIDDEN = [r"ex2\."]  # no transcendental in the alpha-only epilogue


def kernel_name(cfg: KernelConfig) -> str:
    return f"cutedsl_sm100.nvfp4_gemm.{cfg.tag}"


def compile_one(cfg: KernelConfig, arch: str = ARCH) -> KernelBuild:
    required = REQUIRED + (SWIGLU_REQUIRED if cfg.swiglu else [])
    forbidden = FORBIDDEN + ([] if cfg.swiglu else PLAIN_FORBIDDEN)
    if arch != ARCH:
        required = [p.replace("sm_100a", arch) for p in required]
    t0 = time.perf_counter()
    try:
        from .launch import compile_kernel

        _, ptx, seconds = compile_kernel(cfg, arch, keep_ptx=True)
    except Exception as e:  # reported, not raised: the pre-flight lists every failing build
        return KernelBuild(kernel_name(cfg), arch, "", time.perf_counter() - t0, required, forbidden,
                           error=f"{type(e).__name__}: {e}")
    return KernelBuild(kernel_name(cfg), arch, ptx or "", seconds, required, forbidden)


def compile_for_check(configs: tuple[KernelConfig, ...] = CONFIGS, arch: str = ARCH) -> list[KernelBuild]:
    """One ``KernelBuild`` per kernel configuration, compiled for ``arch`` (sm_100a) on this machine."""
    return [compile_one(cfg, arch) for cfg in configs]
