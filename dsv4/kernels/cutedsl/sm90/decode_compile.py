"""Pre-flight of the sm_90a decode GEMM (``decode_gemm_kernel.py``): every shape class its route can
pick (the default plan's: 8 or 16 tokens, dense or grouped, plain or SwiGLU), compiled with placeholder
pointers, its PTX kept for the census. ``compile_check`` lists these beside the generic kernel's."""
from __future__ import annotations

from ..common import KernelBuild, check_build
from .decode_launch import ARCH, decode_plan

# warp-level FP16 MMAs fed from an mbarrier ring, the FP4 decoded in registers: no WGMMA, no sm_100 code
REQUIRED = [r"\.target\s+sm_90a", r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32",
            r"mbarrier\.try_wait\.parity", r"cp\.async", r"cvt\.rn\.bf16(x2)?\.f32"]
FORBIDDEN = [r"tcgen05", r"wgmma", r"cvt\.[a-z0-9.]*e2m1x2"]
SWIGLU_REQUIRED = [r"ex2\.approx"]
PLAIN_FORBIDDEN = [r"ex2\."]   # no transcendental in the alpha-only epilogue


def decode_variants() -> list[tuple[str, object]]:
    """(name, DecodeConfig) of the default plan at 1 and 16 tokens, dense (7168 -> 3072) and grouped
    (6 of 384 experts), plain and SwiGLU."""
    out = []
    for m in (1, 16):
        for swiglu in (False, True):
            for experts in (0, 384):
                rows = m * 6 if experts else m
                cfg = decode_plan(rows, 2 * 3072 if swiglu else 3072, 7168, swiglu=swiglu, num_sms=132,
                                  num_experts=experts).cfg
                name = f"decode_gemm.{'grouped' if experts else 'dense'}_q{cfg.ntok}{'_swiglu' if swiglu else ''}"
                out.append((name, cfg))
    return list(dict(out).items())     # one build per shape class


def decode_builds(arch: str = ARCH) -> list[KernelBuild]:
    from .decode_launch import compile_decode_gemm

    return [check_build(f"cutedsl_sm90.{name}", arch, lambda cfg=cfg: compile_decode_gemm(cfg, arch, keep_ptx=True),
                        REQUIRED + (SWIGLU_REQUIRED if cfg.swiglu else []),
                        FORBIDDEN + ([] if cfg.swiglu else PLAIN_FORBIDDEN))
            for name, cfg in decode_variants()]
