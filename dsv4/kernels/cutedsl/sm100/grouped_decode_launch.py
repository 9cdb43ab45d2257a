"""Host side of the sm_100a grouped decode GEMM: launch plan, compiles, and the two launches (token
gather, then the GEMM) of ``GroupedDecodeGemm100(device)(req)`` for a ``GroupedGemmRequest``.

Meant for decode routing (``decode_route.use_grouped_decode_kernel``: about one row per expert);
any routing is computed correctly, more rows per expert only take more token-tile slots. Numerics are
the dense decode kernel's (block-scaled MMA, FP32 accumulation, alpha in FP32, BF16 out, fixed split-K
order). The launch path reads no device tensor on the host: the slot count comes from shapes
(``token_tiles.slot_count``) and the schedule from the gather kernel, so a call can be captured in a
CUDA graph and replayed with new offsets (``check_values=False`` is implied while capturing).

The plan (``GroupedDecodePlan``, ``grouped_decode_plan``) is pure Python; ``cutlass`` is imported only
when a kernel is compiled.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import GroupedGemmRequest, KernelContractError
from ..common import (KernelCache, LaunchResources, capturing, check_align, check_cuda, compile_placeholder,
                      cu_stream, expect, gmem_ptr)
from .decode_launch import ARCH, ARCH_MAJOR, INT32_MAX, MAX_SPLITS, MAX_TOKENS, DecodeConfig, decode_plan
from .layout import TILE_M, TMA_K_MULTIPLE, launch_problems, swizzled_scales, weight_scale_view
from .token_tiles import SCHED_COLS, slot_count, slot_scale_bytes

MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class GroupedDecodePlan:
    cfg: DecodeConfig
    tiles: int  # grid.x: 128-column output tiles of one expert
    splits: int  # grid.y: K ranges
    slots: int  # grid.z: token-tile slots (a bound; the empty ones return at once)
    k_tiles: int

    @property
    def ctas(self) -> int:
        return self.tiles * self.splits * self.slots

    @property
    def workspace_floats(self) -> int:
        return self.ctas * self.cfg.num_a * TILE_M * self.cfg.ntok if self.splits > 1 else 0


def token_tile(rows: int, experts: int) -> int:
    """MMA N for ``rows`` rows over ``experts`` groups: 8 while the average non-empty expert (as if
    every row had its own expert up to E) holds <= 8 rows, else 16."""
    per_expert = rows / max(1, min(experts, rows))
    return 8 if per_expert <= 8 else 16


def grouped_decode_plan(rows: int, experts: int, n: int, k: int, *, swiglu: bool, num_sms: int,
                        max_splits: int = MAX_SPLITS, stages: int | None = None) -> GroupedDecodePlan:
    """``rows`` token rows over ``experts`` weights of ``n`` rows each (``[gate; up]`` with SwiGLU).
    The split count is ``decode_plan``'s rule applied to the ``tiles * slots`` CTAs of one split."""
    if rows < 1 or experts < 1:
        raise ValueError(f"grouped decode plan: expected rows >= 1 and experts >= 1, found {rows}, {experts}")
    ntok = token_tile(rows, experts)
    slots = slot_count(rows, experts, ntok)
    n_out = n // 2 if swiglu else n
    tiles = -(-n_out // TILE_M)
    # decode_plan only sees weight-row tiles: give it tiles * slots of them (x2 rows with SwiGLU)
    p = decode_plan(ntok, tiles * slots * TILE_M * (2 if swiglu else 1), k, swiglu=swiglu, num_sms=num_sms,
                    max_splits=max_splits, stages=stages)
    return GroupedDecodePlan(p.cfg, tiles, p.splits, slots, p.k_tiles)


# ---- compile ------------------------------------------------------------------------------------
def gemm_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm100GroupedDecodeGemm.__call__``."""
    import cutlass

    from .kernel import AB_DTYPE, C_DTYPE, SF_DTYPE
    from .layout import TMA_ALIGN_BYTES as T

    f32, i32 = cutlass.Float32, cutlass.Int32
    return [(AB_DTYPE, T), (AB_DTYPE, T), (SF_DTYPE, T), (SF_DTYPE, T), (C_DTYPE, 2), (f32, 4), (f32, 4),
            (i32, 16), (f32, 4), (i32, 4)]


def gather_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``TokenGather.__call__``."""
    import cutlass

    u8, i32 = cutlass.Uint8, cutlass.Int32
    return [(i32, 4), (u8, 16), (u8, 4), (u8, 16), (u8, 16), (i32, 16)]


def compile_grouped_decode_gemm(cfg: DecodeConfig, arch: str = ARCH, *, keep_ptx: bool = False):
    """One GEMM shape class, placeholder pointers (no GPU): the executor, or ``(executor, ptx, seconds)``."""
    from cutlass import Float32, Int32

    from .grouped_decode_kernel import Sm100GroupedDecodeGemm

    return compile_placeholder(Sm100GroupedDecodeGemm(cfg.ntok, cfg.swiglu, cfg.stages), gemm_arg_types(),
                               [*([Int32(1)] * 6), Float32(1.0)], arch=arch, keep_ptx=keep_ptx)


def compile_token_gather(ntok: int, arch: str = ARCH, *, keep_ptx: bool = False):
    """The token gather for ``ntok`` rows per slot, placeholder pointers (no GPU)."""
    from cutlass import Int32

    from .token_gather_kernel import TokenGather

    return compile_placeholder(TokenGather(ntok), gather_arg_types(), [Int32(1), Int32(TMA_K_MULTIPLE), Int32(1)],
                               arch=arch, keep_ptx=keep_ptx)


# ---- launches -----------------------------------------------------------------------------------
class GroupedDecodeGemm100(LaunchResources):
    """Grouped NVFP4 GEMMs at decode sizes on sm_100a. Executors cached per (device, arch, config)."""

    def __init__(self, device: torch.device | str = "cuda", **plan_kw):
        self.device = torch.device(device)
        self.plan_kw = plan_kw
        self._exes = KernelCache(scope=("sm100-grouped-decode-gemm", str(self.device)))

    @staticmethod
    def supports(req, max_rows_per_expert: int = MAX_TOKENS) -> bool:
        """Grouped, K % 32 == 0, 16-byte aligned packed data, at most ``max_rows_per_expert`` rows per
        expert on average (else the generic kernel)."""
        if not isinstance(req, GroupedGemmRequest):
            return False
        rows, e = req.a.rows, max(req.num_experts, 1)
        return (req.a.k % TMA_K_MULTIPLE == 0 and req.a.k == req.b.k
                and all(op.packed.data_ptr() % 16 == 0 for op in (req.a, req.b))
                and rows <= max_rows_per_expert * min(e, max(rows, 1)))

    def plan(self, rows: int, experts: int, n: int, k: int, swiglu: bool) -> GroupedDecodePlan:
        return grouped_decode_plan(rows, experts, n, k, swiglu=swiglu, num_sms=self._sms(), **self.plan_kw)

    def prepare(self, req: GroupedGemmRequest, *, check_values: bool = True,
                validated: bool = False) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Validate (device-agnostic) and return (weight scales per batch, token scales, output columns,
        weight batches). Raises ``KernelContractError`` naming expected vs found; ``validated``: the
        caller ran ``req.validate()``."""
        expect(isinstance(req, GroupedGemmRequest), "request", "a GroupedGemmRequest", type(req).__name__)
        if not validated:
            req.validate(check_values=check_values and not capturing())
        a, b, e = req.a, req.b, req.num_experts
        wsf, n_out, lb = weight_scale_view(b, e, req.swiglu_limit is not None)
        xsf = swizzled_scales(a.scales, a.scale_layout, a.rows, a.k)
        problems = launch_problems(a.rows, n_out, a.k, dict(a=a.packed, b=b.packed, b_scales=wsf))
        if problems:
            raise KernelContractError("; ".join(problems))
        check_align(xsf, "a scales", 4)  # read by the gather in 4-byte words
        expect(req.offsets.is_contiguous() and b.global_scale.is_contiguous(), "offsets / b.global_scale",
               "contiguous tensors", "a strided view")
        return wsf, xsf, n_out, lb

    def __call__(self, req: GroupedGemmRequest, *, check_values: bool = True,
                 validated: bool = False) -> torch.Tensor:
        wsf, xsf, n_out, lb = self.prepare(req, check_values=check_values, validated=validated)
        a, b, e = req.a, req.b, req.num_experts
        check_cuda(a.packed, "operands")
        cap = torch.cuda.get_device_capability(a.device)
        expect(cap[0] == ARCH_MAJOR, "device compute capability", f"({ARCH_MAJOR}, x) (sm_100a family)", cap)
        arch = f"sm_{cap[0]}{cap[1]}a"
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        if a.rows == 0:
            return out
        plan = self.plan(a.rows, e, req.n_per_expert, a.k, req.swiglu_limit is not None)
        expect(plan.workspace_floats <= INT32_MAX, "split-K workspace", "< 2^31 floats", plan.workspace_floats)
        expect(max(plan.splits, plan.slots) <= MAX_GRID_YZ, "grid.y / grid.z (splits, slots)",
               f"<= {MAX_GRID_YZ}", (plan.splits, plan.slots))
        ntok, dev = plan.cfg.ntok, a.device
        x_tiles = torch.empty(plan.slots * ntok, a.k // 2, dtype=torch.uint8, device=dev)
        x_scales = torch.empty(plan.slots * slot_scale_bytes(a.k), dtype=torch.uint8, device=dev)
        sched = torch.empty(plan.slots, SCHED_COLS, dtype=torch.int32, device=dev)
        stream = cu_stream(dev)
        gather = self._exes.get((arch, "gather", ntok), lambda: compile_token_gather(ntok, arch))
        g_tensors = (req.offsets, a.packed, xsf, x_tiles, x_scales, sched)
        gather(*[gmem_ptr(t, dt, al) for t, (dt, al) in zip(g_tensors, gather_arg_types())], e, a.k, plan.slots,
               stream)
        exe = self._exes.get((arch, plan.cfg), lambda: compile_grouped_decode_gemm(plan.cfg, arch))
        ws, cnt = self._split_k_buffers(plan.splits, plan.workspace_floats, plan.tiles * plan.slots, dev,
                                        req.alphas)
        # alpha = a.global_scale * b.global_scale[e] in FP32 (the dense epilogue's product): alphas[e]
        # bit for bit, as the contract requires of the alphas
        tensors = (b.packed, x_tiles, wsf, x_scales, out, a.global_scale, b.global_scale, sched, ws, cnt)
        exe(*[gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, gemm_arg_types())], n_out, a.k, lb,
            plan.slots, plan.tiles, plan.splits, float(req.swiglu_limit or 0.0), stream)
        return out
