"""Pre-flight of the sm_100a decode GEMMs (``decode_kernel.py``, ``grouped_decode_kernel.py``) and the
grouped form's token gather (``token_gather_kernel.py``): each shape class compiled with placeholder
pointers for sm_100a, its PTX kept for the census (the generic kernel's patterns: the block-scaled NVFP4
MMA into TMEM). ``compile_check`` lists these beside the generic kernel's."""
from __future__ import annotations

from ..common import KernelBuild, check_build
from .compile import FORBIDDEN, PLAIN_FORBIDDEN, REQUIRED, SWIGLU_REQUIRED
from .decode_launch import ARCH, DecodeConfig

# the gather is plain SIMT: global loads and stores, nothing of the MMA path
GATHER_REQUIRED = [r"\.target\s+sm_100a", r"ld\.global", r"st\.global"]
GATHER_FORBIDDEN = [r"tcgen05", r"wgmma"]
SHAPE_CLASSES = tuple(DecodeConfig(ntok, swiglu) for ntok in (8, 16) for swiglu in (False, True))


def decode_builds(arch: str = ARCH) -> list[KernelBuild]:
    from .decode_launch import compile_decode_gemm
    from .grouped_decode_launch import compile_grouped_decode_gemm, compile_token_gather

    def on_arch(patterns: list[str]) -> list[str]:
        return [p.replace("sm_100a", arch) for p in patterns]

    builds = []
    for cfg in SHAPE_CLASSES:
        req = REQUIRED + (SWIGLU_REQUIRED if cfg.swiglu else [])
        forbidden = FORBIDDEN + ([] if cfg.swiglu else PLAIN_FORBIDDEN)
        for kind, fn in (("decode_gemm", compile_decode_gemm), ("grouped_decode_gemm", compile_grouped_decode_gemm)):
            builds.append(check_build(f"cutedsl_sm100.{kind}.{cfg.tag}", arch,
                                      lambda fn=fn, cfg=cfg: fn(cfg, arch, keep_ptx=True), on_arch(req), forbidden))
    for ntok in (8, 16):
        builds.append(check_build(f"cutedsl_sm100.token_gather.t{ntok}", arch,
                                  lambda ntok=ntok: compile_token_gather(ntok, arch, keep_ptx=True),
                                  on_arch(GATHER_REQUIRED), GATHER_FORBIDDEN))
    return builds
