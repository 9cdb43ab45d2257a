"""Host side of the sm_90a decode GEMM (``decode_gemm_kernel.py``): compile, launch plan, launches.

``DecodeGemm(device)(req)`` runs a dense ``GemmRequest`` with ``1 <= a.rows <= 16`` and
``K % 32 == 0`` (``DecodeGemm.supports(req)``); ``DecodeGemm.grouped(req)`` a
``GroupedGemmRequest`` with ``K % 32 == 0`` (meant for decode routing: a few rows per expert).
Numerics are those of ``Sm90Backend`` (exact FP16 products, FP32 accumulation, alpha in FP32,
optional SwiGLU, BF16 out) with a different, fixed (deterministic) FP32 summation order.

Wiring (for the backend): ``if DecodeGemm.supports(req): return self._decode(req)`` at the top of
``Sm90Backend.gemm`` (and ``supports_grouped`` / ``grouped`` in ``grouped_gemm``).

Launch plan: 128 weight rows per CTA (64 output columns with SwiGLU; ``rows=64`` / ``256`` scale both),
split-K so that ``tiles * splits * slots`` covers ``ctas_per_sm`` CTAs on every SM (no empty split).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import GemmRequest, GroupedGemmRequest, KernelContractError
from ..common import (KernelCache, LaunchResources, capturing, check_align, check_cuda, compile_executor,
                      compile_with_ptx, cu_stream, expect, fake_gmem_ptr, gmem_ptr, kernel_scales)
from .decode_gemm_kernel import DecodeConfig, Sm90DecodeGemm

ARCH = "sm_90a"
MAX_TOKENS = 16
MAX_SPLITS = 16
INT32_MAX = 2**31 - 1


def decode_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm90DecodeGemm.__call__``."""
    import cutlass

    u8, f32, i32 = cutlass.Uint8, cutlass.Float32, cutlass.Int32
    return [(u8, 16), (u8, 4), (u8, 16), (u8, 4), (f32, 4), (f32, 4), (i32, 4), (cutlass.BFloat16, 2),
            (f32, 4), (i32, 4)]


def compile_decode_gemm(cfg: DecodeConfig, arch: str = ARCH, *, keep_ptx: bool = False):
    """Compile one decode shape class with placeholder pointers (no GPU needed)."""
    import cuda.bindings.driver as cuda
    from cutlass import Float32, Int32

    ptrs = [fake_gmem_ptr(dt, al) for dt, al in decode_arg_types()]
    args = (Sm90DecodeGemm(cfg), *ptrs, *([Int32(1)] * 7), Float32(1.0), cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(*args, arch=arch)
    return compile_executor(*args, arch=arch)


@dataclass(frozen=True)
class DecodePlan:
    cfg: DecodeConfig
    tiles: int  # grid.x: weight-row tiles
    splits: int  # grid.y
    slots: int = 1  # grid.z: token-tile slots (grouped)

    @property
    def ctas(self) -> int:
        return self.tiles * self.splits * self.slots

    @property
    def workspace_floats(self) -> int:
        return self.ctas * self.cfg.rows * self.cfg.ntok if self.splits > 1 else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decode_plan(m: int, n: int, k: int, *, swiglu: bool, num_sms: int, bk: int = 256,
                stages: int | None = None, consumer_warps: int = 4, ctas_per_sm: int = 2,
                max_splits: int = MAX_SPLITS, rows: int = 128, num_experts: int = 0,
                copy16: bool = True, reduce_ilp: bool = True) -> DecodePlan:
    """Dense (``num_experts=0``: ``m`` tokens) or grouped (``m`` rows over ``num_experts`` experts of
    ``n`` rows each; token tiles are scheduled on the device, ``slots`` bounds their count without
    reading the offsets: sum_e ceil(m_e / t) <= m // t + min(E, m)).

    ``stages=None``: two ring stages per consumer phase group (4 for the default 128 rows x 4
    warps), so the producer keeps a k-tile in flight for every group that is decoding one.
    ``copy16``: weight rows by coalesced 16-byte cp.async (``DecodeConfig.copy16``) instead of one TMA
    bulk copy per row; ``reduce_ilp``: the split-K sum with one split's loads in flight at once. Both
    defaults measured on an H100 80GB, bit-identical outputs (benchmarks/results/): copy16 faster at all
    14 Pro dense decode shapes (LM head 456 -> 188 us) and 2.1x faster grouped at Pro's 6-of-384
    (w13 T=1: 215 -> 101 us); reduce_ilp on top of it, e.g. 7168->3072 M=1 18.5 -> 13.4 us and wq_a
    M=16 26.4 -> 14.1 us (the LM head, one split, unchanged)."""
    if stages is None:
        stages = max(4, 2 * consumer_warps // (rows // 64))
    grouped = num_experts > 0
    if grouped:
        per_expert = m / max(1, min(num_experts, m))
        ntok = 8 if per_expert <= 8 else 16
    else:
        ntok = 8 if m <= 8 else 16
    cfg = DecodeConfig(ntok=ntok, bk=bk, stages=stages, consumer_warps=consumer_warps, swiglu=swiglu,
                       rows=rows, grouped=grouped, copy16=copy16,
                       reduce_ilp=reduce_ilp)
    n_cols = n // 2 if swiglu else n
    tiles = _cdiv(n_cols, cfg.col_tile)
    slots = m // ntok + min(num_experts, m) if grouped else 1
    k_tiles = _cdiv(k, bk)
    want = _cdiv(ctas_per_sm * num_sms, tiles * slots)
    s = max(1, min(want, max_splits, k_tiles))
    per = _cdiv(k_tiles, s)
    return DecodePlan(cfg, tiles, _cdiv(k_tiles, per), slots)


class DecodeGemm(LaunchResources):
    """Dense NVFP4 GEMMs with at most 16 tokens on Hopper. Executors cached per (device, config)."""

    def __init__(self, device: torch.device | str = "cuda", **plan_kw):
        self.device = torch.device(device)
        self.plan_kw = plan_kw
        self._exes = KernelCache(scope=("sm90-decode-gemm", str(self.device)))

    @staticmethod
    def _aligned(req) -> bool:
        return all(op.packed.data_ptr() % 16 == 0 and op.scales.data_ptr() % 4 == 0 for op in (req.a, req.b))

    @staticmethod
    def supports(req: GemmRequest) -> bool:
        """Dense, 1..16 tokens, K % 32 == 0, 16-byte aligned packed data (else: the generic kernel)."""
        return (isinstance(req, GemmRequest) and 1 <= req.a.rows <= MAX_TOKENS and req.a.k % 32 == 0
                and DecodeGemm._aligned(req))

    @staticmethod
    def supports_grouped(req: GroupedGemmRequest, max_rows_per_expert: float = 16.0) -> bool:
        """Decode-sized routing (few rows per expert on average; any routing is computed correctly)."""
        e = max(req.num_experts, 1)
        return (isinstance(req, GroupedGemmRequest) and req.a.k % 32 == 0 and DecodeGemm._aligned(req)
                and req.a.rows <= max_rows_per_expert * min(e, max(req.a.rows, 1)))

    def plan(self, m: int, n: int, k: int, swiglu: bool) -> DecodePlan:
        return decode_plan(m, n, k, swiglu=swiglu, num_sms=self._sms(), **self.plan_kw)

    def grouped_plan(self, m: int, num_experts: int, n: int, k: int, swiglu: bool) -> DecodePlan:
        return decode_plan(m, n, k, swiglu=swiglu, num_sms=self._sms(), num_experts=num_experts, **self.plan_kw)

    def _check(self, req) -> None:
        a, b = req.a, req.b
        expect(a.k % 32 == 0, "decode GEMM K", "a multiple of 32 (16-byte aligned rows)", a.k)
        for op, name in ((a, "a"), (b, "b")):
            check_cuda(op.packed, f"{name}.packed")
            check_align(op.packed, f"{name}.packed", 16)
            check_align(op.scales, f"{name}.scales", 4)

    def _launch(self, plan: DecodePlan, a, a_scales, b, b_scales, alpha_a, alpha_b, offsets, m, n, k, e,
                out, limit) -> None:
        expect(plan.workspace_floats <= INT32_MAX, "split-K workspace", "< 2^31 floats", plan.workspace_floats)
        expect(plan.splits <= 65535 and plan.slots <= 65535, "grid.y / grid.z", "<= 65535",
               (plan.splits, plan.slots))
        exe = self._exes.get((ARCH, plan.cfg), lambda: compile_decode_gemm(plan.cfg))
        dev = out.device
        ws, cnt = self._split_k_buffers(plan.splits, plan.workspace_floats, plan.tiles * plan.slots, dev, alpha_b)
        offs = offsets if offsets is not None else alpha_b
        tensors = (a.packed, a_scales, b.packed, b_scales, alpha_a, alpha_b, offs, out, ws, cnt)
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, decode_arg_types())]
        exe(*ptrs, m, n, k, e, plan.tiles, plan.splits, plan.slots,
            float(limit) if limit is not None else 0.0, cu_stream(dev))

    def __call__(self, req: GemmRequest, *, validated: bool = False) -> torch.Tensor:
        """``validated=True``: the caller ran ``req.validate()`` on this request (``Sm90Backend.gemm``)."""
        if not validated:
            req.validate()
        a, b = req.a, req.b
        m, n, k = a.rows, b.rows, a.k
        if not (1 <= m <= MAX_TOKENS):
            raise KernelContractError(f"decode GEMM tokens: expected 1..{MAX_TOKENS}, found {m}")
        self._check(req)
        plan = self.plan(m, n, k, req.swiglu_limit is not None)
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        self._launch(plan, a, kernel_scales(a), b, kernel_scales(b), a.global_scale, b.global_scale, None,
                     m, n, k, 1, out, req.swiglu_limit)
        return out

    def grouped(self, req: GroupedGemmRequest, *, check_values: bool = True, validated: bool = False) -> torch.Tensor:
        """MoE grouped GEMM at decode sizes (few rows per expert; any routing is correct, rows per
        expert beyond 16 just take more token-tile slots). ``check_values=False`` (implied while
        capturing a CUDA graph) skips the contract's host reads of offsets / alphas; ``validated=True``:
        the caller validated the request (``Sm90Backend.grouped_gemm``)."""
        if not validated:
            req.validate(check_values=check_values and not capturing())
        a, b = req.a, req.b
        e, n, k, m = req.num_experts, req.n_per_expert, a.k, a.rows
        self._check(req)
        expect(req.offsets.is_contiguous() and req.alphas.is_contiguous(), "offsets / alphas",
               "contiguous tensors", "a strided view")
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        if m == 0:
            return out
        plan = self.grouped_plan(m, e, n, k, req.swiglu_limit is not None)
        self._launch(plan, a, kernel_scales(a), b, kernel_scales(b, groups=e), req.alphas, req.alphas,
                     req.offsets, m, n, k, e, out, req.swiglu_limit)
        return out
