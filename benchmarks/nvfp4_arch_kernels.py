"""The kernels ``bench_nvfp4_shapes.py`` times on the GPU it finds, and the route rules it reports, per arch.

sm_90 (H100/H200): ``Sm90Backend`` (shipped path), ``DecodeGemm`` (dense and grouped), the generic
twin ``Sm90Backend(routes=False)``, ``PrefillGemm``. sm_100 (B200): ``Sm100Backend``, ``DecodeGemm100``
(dense only: its grouped form is not written), ``Sm100Backend(routes=False)``, no prefill route.
``route_of`` (pure) names the kernel a call takes, so the CPU tests check it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ARCHS = {9: "sm_90", 10: "sm_100"}


@dataclass
class ArchKernels:
    arch: str
    be: Any            # the shipped backend
    dg: Any            # the decode kernel's host object
    gen: Any           # the backend with routes off: the generic kernel alone
    pre: Any = None    # PrefillGemm (sm_90 only)
    pre_blocks: Any = None   # PrefillGemm cutting its FP32 product in blocks for this card's L2 (sm_90 only)
    grouped_decode: bool = False   # dg.grouped exists


def route_of(arch: str, rows: int, n: int, k: int, experts: int | None = None) -> str:
    """"decode", "prefill" or "generic": the kernel the shipped backend's rule picks for a call of
    ``rows`` rows on an ``n`` x ``k`` weight (``experts``: a grouped call over that many groups)."""
    if arch == "sm_90":
        from dsv4.kernels.cutedsl.sm90.decode_route import use_decode_kernel, use_decode_kernel_grouped
        from dsv4.kernels.cutedsl.sm90.prefill_route import use_prefill_gemm

        if experts is not None:
            return "decode" if use_decode_kernel_grouped(rows, experts, n, k) else "generic"
        return "decode" if use_decode_kernel(rows, n, k) else "prefill" if use_prefill_gemm(rows, n, k) else "generic"
    if arch == "sm_100":
        from dsv4.kernels.cutedsl.sm100.decode_route import use_decode_kernel

        return "decode" if experts is None and use_decode_kernel(rows, n, k) else "generic"
    raise ValueError(f"route_of: expected an arch of {sorted(ARCHS.values())}, found {arch!r}")


def for_this_gpu() -> ArchKernels | None:
    """The kit for the current CUDA device, or None where it is neither sm_90 nor sm_100."""
    import torch

    if not torch.cuda.is_available():
        return None
    arch = ARCHS.get(torch.cuda.get_device_capability()[0])
    if arch == "sm_90":
        from dsv4.kernels.cutedsl.sm90 import Sm90Backend
        from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm
        from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm

        return ArchKernels(arch, Sm90Backend("cuda"), DecodeGemm("cuda"), Sm90Backend("cuda", routes=False),
                           PrefillGemm("cuda"), PrefillGemm("cuda", column_blocks=True), grouped_decode=True)
    if arch == "sm_100":
        from dsv4.kernels.cutedsl.sm100 import Sm100Backend
        from dsv4.kernels.cutedsl.sm100.decode_launch import DecodeGemm100

        return ArchKernels(arch, Sm100Backend("cuda"), DecodeGemm100("cuda"), Sm100Backend("cuda", routes=False))
    return None
