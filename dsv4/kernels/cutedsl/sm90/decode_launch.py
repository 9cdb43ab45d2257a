"""Host side of the sm_90a decode GEMM (``decode_gemm_kernel.py``): compile, launch plan, launches.

``DecodeGemm(device)(req)`` runs a dense ``GemmRequest`` with ``1 <= a.rows <= 16`` and
``K % 32 == 0`` (``DecodeGemm.supports(req)``); its numerics are those of ``Sm90Backend.gemm``
(exact FP16 products, FP32 accumulation, alpha in FP32, optional SwiGLU, BF16 out), with a
different (fixed, deterministic) FP32 summation order.

Launch plan: 128 weight rows per CTA (64 output columns with SwiGLU; ``rows=64`` halves both),
split-K so that
``tiles * splits`` covers ``ctas_per_sm`` CTAs on every SM (no empty split).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import GemmRequest, KernelContractError
from ..common import (KernelCache, check_align, check_cuda, compile_executor, compile_with_ptx, cu_stream,
                      expect, fake_gmem_ptr, gmem_ptr, kernel_scales)
from .decode_gemm_kernel import DecodeConfig, Sm90DecodeGemm

ARCH = "sm_90a"
MAX_TOKENS = 16
MAX_SPLITS = 16
INT32_MAX = 2**31 - 1


def decode_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm90DecodeGemm.__call__``."""
    import cutlass

    u8, f32 = cutlass.Uint8, cutlass.Float32
    return [(u8, 16), (u8, 4), (u8, 16), (u8, 4), (f32, 4), (f32, 4), (cutlass.BFloat16, 2), (f32, 4),
            (cutlass.Int32, 4)]


def compile_decode_gemm(cfg: DecodeConfig, arch: str = ARCH, *, keep_ptx: bool = False):
    """Compile one decode shape class with placeholder pointers (no GPU needed)."""
    import cuda.bindings.driver as cuda
    from cutlass import Float32, Int32

    ptrs = [fake_gmem_ptr(dt, al) for dt, al in decode_arg_types()]
    args = (Sm90DecodeGemm(cfg), *ptrs, *([Int32(1)] * 5), Float32(1.0), cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(*args, arch=arch)
    return compile_executor(*args, arch=arch)


@dataclass(frozen=True)
class DecodePlan:
    cfg: DecodeConfig
    tiles: int  # grid.x: weight-row tiles
    splits: int  # grid.y

    @property
    def ctas(self) -> int:
        return self.tiles * self.splits

    @property
    def workspace_floats(self) -> int:
        return self.tiles * self.splits * self.cfg.rows * self.cfg.ntok if self.splits > 1 else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def decode_plan(m: int, n: int, k: int, *, swiglu: bool, num_sms: int, bk: int = 256,
                stages: int | None = None, consumer_warps: int = 4, ctas_per_sm: int = 2,
                max_splits: int = MAX_SPLITS, rows: int = 128) -> DecodePlan:
    """``stages=None``: two ring stages per consumer phase group (4 for the default 128 rows x 4
    warps), so the producer keeps a k-tile in flight for every group that is decoding one."""
    if stages is None:
        stages = max(4, 2 * consumer_warps // (rows // 64))
    cfg = DecodeConfig(ntok=8 if m <= 8 else 16, bk=bk, stages=stages, consumer_warps=consumer_warps,
                       swiglu=swiglu, rows=rows)
    n_cols = n // 2 if swiglu else n
    tiles = _cdiv(n_cols, cfg.col_tile)
    k_tiles = _cdiv(k, bk)
    want = _cdiv(ctas_per_sm * num_sms, tiles)
    s = max(1, min(want, max_splits, k_tiles))
    per = _cdiv(k_tiles, s)
    return DecodePlan(cfg, tiles, _cdiv(k_tiles, per))


class DecodeGemm:
    """Dense NVFP4 GEMMs with at most 16 tokens on Hopper. Executors cached per (device, config)."""

    def __init__(self, device: torch.device | str = "cuda", **plan_kw):
        self.device = torch.device(device)
        self.plan_kw = plan_kw
        self._exes = KernelCache(scope=("sm90-decode-gemm", str(self.device)))
        self._counters: torch.Tensor | None = None
        self._num_sms: int | None = None

    @staticmethod
    def supports(req: GemmRequest) -> bool:
        return isinstance(req, GemmRequest) and 1 <= req.a.rows <= MAX_TOKENS and req.a.k % 32 == 0

    def _sms(self) -> int:
        if self._num_sms is None:
            self._num_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        return self._num_sms

    def plan(self, m: int, n: int, k: int, swiglu: bool) -> DecodePlan:
        return decode_plan(m, n, k, swiglu=swiglu, num_sms=self._sms(), **self.plan_kw)

    def _tile_counters(self, n: int, device: torch.device) -> torch.Tensor:
        """Zeroed int32 split-K counters; the kernel leaves them zero after every launch."""
        if self._counters is None or self._counters.numel() < n or self._counters.device != device:
            self._counters = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        return self._counters

    def __call__(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        a, b = req.a, req.b
        m, n, k = a.rows, b.rows, a.k
        if not (1 <= m <= MAX_TOKENS):
            raise KernelContractError(f"decode GEMM tokens: expected 1..{MAX_TOKENS}, found {m}")
        expect(k % 32 == 0, "decode GEMM K", "a multiple of 32 (16-byte aligned rows)", k)
        for op, name in ((a, "a"), (b, "b")):
            check_cuda(op.packed, f"{name}.packed")
            check_align(op.packed, f"{name}.packed", 16)
            check_align(op.scales, f"{name}.scales", 4)
        swiglu = req.swiglu_limit is not None
        plan = self.plan(m, n, k, swiglu)
        expect(plan.workspace_floats <= INT32_MAX, "split-K workspace", "< 2^31 floats", plan.workspace_floats)
        exe = self._exes.get((ARCH, plan.cfg), lambda: compile_decode_gemm(plan.cfg))
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        dev = out.device
        if plan.splits > 1:
            ws = torch.empty(plan.workspace_floats, dtype=torch.float32, device=dev)
            cnt = self._tile_counters(plan.tiles, dev)
        else:
            ws, cnt = b.global_scale, b.global_scale  # never dereferenced
        tensors = (a.packed, kernel_scales(a), b.packed, kernel_scales(b), a.global_scale, b.global_scale,
                   out, ws, cnt)
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, decode_arg_types())]
        exe(*ptrs, m, n, k, plan.tiles, plan.splits, float(req.swiglu_limit) if swiglu else 0.0,
            cu_stream(dev))
        return out
