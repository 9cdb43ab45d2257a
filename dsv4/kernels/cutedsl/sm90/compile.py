"""Pre-flight: compile every sm_90a GEMM shape class the backend can pick and the prefill route's
dequantization and epilogue kernels, keeping the PTX."""
from __future__ import annotations

from ..common import KernelBuild
from .backend import ARCH, compile_gemm
from .configs import decode_config, prefill_config

# A WGMMA with FP16 operands and FP32 accumulation, and no sm_100 FP4 conversion or tcgen05.
REQUIRED = [r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16", r"prmt\.b32",
            r"cvt\.rn\.f16x2\.e4m3x2", r"cp\.async"]
FORBIDDEN = [r"cvt\.[a-z0-9.]*e2m1x2", r"tcgen05", r"mul\.[a-z0-9.]*ftz[a-z0-9.]*f16x2"]


def gemm_variants() -> list[tuple[str, object]]:
    """(name, GemmConfig) of the shape classes the backend's heuristics produce (K % 32 == 0),
    plus the K % 32 == 16 (8-byte copy) variant."""
    k = 7168
    out = []
    for q in (8, 16, 32, 64):
        out.append((f"dense_decode_q{q}", decode_config(q, grouped=False, swiglu=False, k=k)))
    out.append(("dense_decode_q8_swiglu", decode_config(8, grouped=False, swiglu=True, k=k)))
    out.append(("dense_prefill_128x128", prefill_config(128, grouped=False, swiglu=False, k=k)))
    out.append(("dense_prefill_128x128_swiglu", prefill_config(128, grouped=False, swiglu=True, k=k)))
    for q in (8, 16):
        out.append((f"grouped_decode_q{q}_swiglu", decode_config(q, grouped=True, swiglu=True, k=k)))
    out.append(("grouped_decode_q8", decode_config(8, grouped=True, swiglu=False, k=k)))
    out.append(("grouped_prefill_64x128_swiglu", prefill_config(64, grouped=True, swiglu=True, k=k)))
    out.append(("grouped_prefill_128x128", prefill_config(128, grouped=True, swiglu=False, k=k)))
    out.append(("dense_decode_q8_k16mod32", decode_config(8, grouped=False, swiglu=False, k=7168 + 16)))
    return out


def compile_for_check(names: list[str] | None = None) -> list[KernelBuild]:
    """Compile each GEMM variant and the prefill route's kernels for sm_90a; compile errors become
    ``KernelBuild.error``."""
    from .dequant_kernel import dequant_builds
    from .epilogue_kernel import epilogue_builds

    builds = [b for b in (*dequant_builds(ARCH), *epilogue_builds(ARCH)) if names is None or b.name in names]
    for name, cfg in gemm_variants():
        if names is not None and name not in names:
            continue
        try:
            _, ptx, secs = compile_gemm(cfg, ARCH, keep_ptx=True)
            builds.append(KernelBuild(name, ARCH, ptx, secs, list(REQUIRED), list(FORBIDDEN)))
        except Exception as e:  # surfaced by the pre-flight table / tests
            builds.append(KernelBuild(name, ARCH, "", 0.0, list(REQUIRED), list(FORBIDDEN),
                                      error=f"{type(e).__name__}: {e}"))
    return builds
