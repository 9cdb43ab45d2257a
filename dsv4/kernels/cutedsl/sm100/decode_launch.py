"""Host side of the sm_100a decode GEMM (``decode_kernel.py``): launch plan, compile, launches.

``DecodeGemm100(device)(req)`` runs a dense ``GemmRequest`` with ``1 <= a.rows <= 16`` tokens and
``K % 32 == 0`` (``DecodeGemm100.supports(req)``), plain or with the fused SwiGLU (weights stacked
``[gate; up]``). Numerics are those of ``Sm100Backend`` (block-scaled MMA, FP32 accumulation, alpha in
FP32, BF16 out) with a fixed, deterministic split-K summation order. The grouped (MoE) form is
``grouped_decode_launch.GroupedDecodeGemm100`` (its route off until it has run on a B200).

Wiring: ``Sm100Backend.gemm`` sends a request here when ``decode_route.use_decode_kernel`` and
:meth:`DecodeGemm100.supports` say so (``Sm100Backend.route``); ``prepare_gemm`` and the generic path
stay as they are for the rest.

The plan part (``DecodeConfig``, ``decode_plan``) is pure Python; ``cutlass`` is imported only when a
kernel is compiled.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import FP4_BLOCK, GemmRequest, KernelContractError
from ..common import (KernelCache, LaunchResources, check_cuda, compile_executor, compile_with_ptx,
                      cu_stream, expect, fake_gmem_ptr, gmem_ptr)
from .layout import (SF_TILE_ROWS, TILE_K, TILE_M, TMA_K_MULTIPLE, launch_problems, swiglu_half_scales,
                     swizzled_scales)

ARCH = "sm_100a"
ARCH_MAJOR = 10
MAX_TOKENS = 16
MAX_SPLITS = 16
INT32_MAX = 2**31 - 1
SMEM_PER_SM = 233472  # sm_100: 228 KiB of shared memory per SM ...
SMEM_PER_CTA_RESERVED = 1024  # ... of which 1 KiB is reserved per resident CTA
SMEM_OVERHEAD = 4096  # barriers, TMEM handle, 1 KiB alignment of the swizzled tiles (kernel.SMEM_RESERVED)
MAX_STAGES = 8


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time shape class: token tile (MMA N: 8 or 16), fused SwiGLU, ring depth."""

    ntok: int = 8
    swiglu: bool = False
    stages: int = 4

    @property
    def num_a(self) -> int:
        return 2 if self.swiglu else 1

    @property
    def stage_bytes(self) -> int:
        """A + SFA per weight batch, B + its SFB tile (always one whole 128-row scale atom) once."""
        a = TILE_M * TILE_K // 2 + TILE_M * TILE_K // FP4_BLOCK
        b = self.ntok * TILE_K // 2 + SF_TILE_ROWS * TILE_K // FP4_BLOCK
        return self.num_a * a + b

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + SMEM_OVERHEAD

    @property
    def tag(self) -> str:
        return f"n{self.ntok}_{'swiglu' if self.swiglu else 'plain'}_s{self.stages}"


def decode_stages(ntok: int, swiglu: bool) -> int:
    """Ring depth: the deepest ring that lets two CTAs share an SM (each hides the other's prologue and
    epilogue) if that still leaves >= 4 stages, else the deepest ring of one CTA per SM."""
    sb = DecodeConfig(ntok, swiglu, 2).stage_bytes
    for per_sm in (2, 1):
        stages = min(MAX_STAGES, (SMEM_PER_SM // per_sm - SMEM_PER_CTA_RESERVED - SMEM_OVERHEAD) // sb)
        if stages >= 4 or per_sm == 1:
            return max(2, stages)
    raise AssertionError("unreachable")


def ctas_per_sm(cfg: DecodeConfig) -> int:
    return max(1, SMEM_PER_SM // (cfg.smem_bytes() + SMEM_PER_CTA_RESERVED))


@dataclass(frozen=True)
class DecodePlan:
    cfg: DecodeConfig
    tiles: int  # grid.x: 128-column output tiles
    splits: int  # grid.y: K ranges
    k_tiles: int

    @property
    def ctas(self) -> int:
        return self.tiles * self.splits

    @property
    def per_split(self) -> int:
        """k-tiles per split (the kernel's ``ceil(k_tiles / splits)``; the last split takes the rest)."""
        return -(-self.k_tiles // self.splits)

    @property
    def workspace_floats(self) -> int:
        return self.ctas * self.cfg.num_a * TILE_M * self.cfg.ntok if self.splits > 1 else 0


def decode_plan(m: int, n: int, k: int, *, swiglu: bool, num_sms: int, max_splits: int = MAX_SPLITS,
                stages: int | None = None) -> DecodePlan:
    """``m`` tokens x ``n`` weight rows (``[gate; up]`` with SwiGLU) x ``K``.

    Split count: among the splits that put a CTA on >= 90% of the SMs (or on every k-tile, for small
    problems), the least modelled time ``ceil(ctas / SMs) * (k-tiles per split + 1)``: what the
    busiest SM streams (co-resident CTAs share its bandwidth) plus a CTA's fixed cost (prologue,
    epilogue, the partial's round trip); ties go to fewer splits. Splits are recomputed from the
    k-tiles per split, so none is empty."""
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"decode plan tokens: expected 1..{MAX_TOKENS}, found {m}")
    ntok = 8 if m <= 8 else 16
    cfg = DecodeConfig(ntok, swiglu, stages or decode_stages(ntok, swiglu))
    n_out = n // 2 if swiglu else n
    tiles = -(-n_out // TILE_M)
    k_tiles = -(-k // TILE_K)
    cover = 0.9 * min(num_sms, tiles * min(k_tiles, max_splits))
    best = None
    for s in range(1, min(max_splits, k_tiles) + 1):
        per = -(-k_tiles // s)
        s_eff = -(-k_tiles // per)
        ctas = tiles * s_eff
        key = (ctas < cover, -(-ctas // num_sms) * (per + 1), s_eff)
        if best is None or key < best[0]:
            best = (key, s_eff)
    return DecodePlan(cfg, tiles, best[1], k_tiles)


# ---- compile ------------------------------------------------------------------------------------
def decode_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm100DecodeGemm.__call__``."""
    import cutlass

    from .kernel import AB_DTYPE, C_DTYPE, SF_DTYPE
    from .layout import TMA_ALIGN_BYTES as T

    f32 = cutlass.Float32
    return [(AB_DTYPE, T), (AB_DTYPE, T), (SF_DTYPE, T), (SF_DTYPE, T), (C_DTYPE, 2), (f32, 4), (f32, 4),
            (f32, 4), (cutlass.Int32, 4)]


def compile_decode_gemm(cfg: DecodeConfig, arch: str = ARCH, *, keep_ptx: bool = False):
    """Compile one shape class with placeholder pointers (no GPU needed): the executor, or
    ``(executor, ptx, seconds)`` with ``keep_ptx``."""
    import cuda.bindings.driver as cuda
    from cutlass import Float32, Int32

    from .decode_kernel import Sm100DecodeGemm

    ptrs = [fake_gmem_ptr(dt, al) for dt, al in decode_arg_types()]
    args = (Sm100DecodeGemm(cfg.ntok, cfg.swiglu, cfg.stages), *ptrs, *([Int32(1)] * 6), Float32(1.0),
            cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(*args, arch=arch)
    return compile_executor(*args, arch=arch)


# ---- launches -----------------------------------------------------------------------------------
def weight_scales(req: GemmRequest) -> torch.Tensor:
    """Flat swizzled weight scales as the kernel's A batches: one, or gate (0) and up (1) halves."""
    b = req.b
    if req.swiglu_limit is None:
        return swizzled_scales(b.scales, b.scale_layout, b.rows, b.k)
    if b.scale_layout == "linear":  # the halves are contiguous row blocks: swizzle each directly
        return swizzled_scales(b.scales, "linear", b.rows, b.k, 2)
    return swiglu_half_scales(b.scales, 1, b.rows, b.k)


class DecodeGemm100(LaunchResources):
    """Dense NVFP4 GEMMs with 1..16 tokens on sm_100a. Executors cached per (device, arch, config)."""

    def __init__(self, device: torch.device | str = "cuda", **plan_kw):
        self.device = torch.device(device)
        self.plan_kw = plan_kw
        self._exes = KernelCache(scope=("sm100-decode-gemm", str(self.device)))

    @staticmethod
    def supports(req) -> bool:
        """Dense, 1..16 tokens, K % 32 == 0, 16-byte aligned packed data (else: the generic kernel)."""
        return (isinstance(req, GemmRequest) and 1 <= req.a.rows <= MAX_TOKENS
                and req.a.k % TMA_K_MULTIPLE == 0 and req.a.k == req.b.k
                and all(op.packed.data_ptr() % 16 == 0 for op in (req.a, req.b)))

    def plan(self, m: int, n: int, k: int, swiglu: bool) -> DecodePlan:
        return decode_plan(m, n, k, swiglu=swiglu, num_sms=self._sms(), **self.plan_kw)

    def prepare(self, req: GemmRequest, *, validated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate (everything a launch needs, device-agnostic) and return the swizzled (weight, token)
        scales. Raises ``KernelContractError`` naming expected vs found. ``validated``: the caller
        (``Sm100Backend.gemm``) has run ``req.validate()`` already."""
        if not validated:
            req.validate()
        a, b = req.a, req.b
        expect(1 <= a.rows <= MAX_TOKENS, "decode GEMM tokens (a.rows)", f"1..{MAX_TOKENS}", a.rows)
        n_out = req.out_shape[1]
        wsf = weight_scales(req)
        xsf = swizzled_scales(a.scales, a.scale_layout, a.rows, a.k)
        problems = launch_problems(a.rows, n_out, a.k, dict(a=a.packed, b=b.packed, a_scales=xsf, b_scales=wsf))
        if problems:
            raise KernelContractError("; ".join(problems))
        expect(a.global_scale.numel() == 1 and b.global_scale.numel() == 1, "global scales",
               "one FP32 value each (dense GEMM)", (a.global_scale.numel(), b.global_scale.numel()))
        return wsf, xsf

    def __call__(self, req: GemmRequest, *, validated: bool = False) -> torch.Tensor:
        wsf, xsf = self.prepare(req, validated=validated)
        a, b = req.a, req.b
        check_cuda(a.packed, "operands")
        cap = torch.cuda.get_device_capability(a.device)
        expect(cap[0] == ARCH_MAJOR, "device compute capability", f"({ARCH_MAJOR}, x) (sm_100a family)", cap)
        arch = f"sm_{cap[0]}{cap[1]}a"
        swiglu = req.swiglu_limit is not None
        m, n_out = req.out_shape
        plan = self.plan(m, b.rows, a.k, swiglu)
        expect(plan.workspace_floats <= INT32_MAX, "split-K workspace", "< 2^31 floats", plan.workspace_floats)
        expect(plan.splits <= 65535, "grid.y (splits)", "<= 65535", plan.splits)
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        exe = self._exes.get((arch, plan.cfg), lambda: compile_decode_gemm(plan.cfg, arch))
        alpha_a = a.global_scale.reshape(1).to(torch.float32).contiguous()
        alpha_b = b.global_scale.reshape(1).to(torch.float32).contiguous()
        ws, cnt = self._split_k_buffers(plan.splits, plan.workspace_floats, plan.tiles, a.device, alpha_b)
        tensors = (b.packed, a.packed, wsf, xsf, out, alpha_a, alpha_b, ws, cnt)
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, decode_arg_types())]
        exe(*ptrs, m, n_out, a.k, plan.cfg.num_a, plan.tiles, plan.splits,
            float(req.swiglu_limit) if swiglu else 0.0, cu_stream(a.device))
        return out
