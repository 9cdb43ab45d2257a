"""``Sm90Backend``: the contract's requests -> validated launches of the sm_90a CuTe DSL kernels."""
from __future__ import annotations

import torch

from ...contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest
from ..act_quant_host import ActQuantRunner
from ..common import (KernelCache, LaunchResources, capturing, check_align, check_cuda, compile_executor,
                      compile_with_ptx, cu_stream, expect, fake_gmem_ptr, gmem_ptr, kernel_scales)
from .configs import Launch, dense_launch, grouped_launch
from .decode_route import use_decode_kernel, use_decode_kernel_grouped
from .gemm_kernel import GemmConfig, Sm90NvFp4Gemm
from . import prefill_route
from .prefill_route import use_prefill_gemm

ARCH = "sm_90a"
INT32_MAX = 2**31 - 1


def gemm_arg_types(cfg: GemmConfig):
    """(dtype, assumed alignment) of the pointer arguments of ``Sm90NvFp4Gemm.__call__``, in order;
    the same table builds the placeholders at compile time and the real pointers at launch."""
    import cutlass

    u8, f32, i32, v = cutlass.Uint8, cutlass.Float32, cutlass.Int32, cfg.vec_bytes
    return [(u8, v), (u8, 4), (u8, v), (u8, 4), (f32, 4), (f32, 4), (i32, 4), (cutlass.BFloat16, 2),
            (f32, 4), (i32, 4)]


def compile_gemm(cfg: GemmConfig, arch: str = ARCH, *, keep_ptx: bool = False):
    """Compile one GEMM shape class with placeholder pointers; shapes are runtime arguments."""
    import cuda.bindings.driver as cuda
    from cutlass import Float32, Int32

    ptrs = [fake_gmem_ptr(dt, al) for dt, al in gemm_arg_types(cfg)]
    scalars = [Int32(1)] * 7 + [Float32(1.0)]
    args = (Sm90NvFp4Gemm(cfg), *ptrs, *scalars, cuda.CUstream(0))
    if keep_ptx:
        return compile_with_ptx(*args, arch=arch)
    return compile_executor(*args, arch=arch)


class Sm90Backend(LaunchResources):
    """NVFP4 GEMMs and activation quantization on Hopper (sm_90a) through CuTe DSL kernels.

    Compiled executors are cached per (device, arch, shape class) for the whole process (a model
    loaded again reuses them); the per-shape values (M, N, K, splits, ...) are runtime arguments, so
    a new M does not recompile.
    """

    name = "cutedsl_sm90"

    def __init__(self, device: torch.device | str = "cuda", *, routes: bool = True):
        """``routes=False``: every GEMM through the generic kernel (``decode_route`` and
        ``prefill_route`` decide otherwise; the benches time both)."""
        self.device = torch.device(device)
        self.routes = routes
        self._gemms = KernelCache(scope=("sm90-gemm", str(self.device)))
        self._act = ActQuantRunner(ARCH)
        self._decode_gemm = None  # DecodeGemm, built on the first decode-sized call
        self._prefill_gemm = None  # PrefillGemm, built on the first prefill-sized call
        self._generic = None  # a routes=False twin (its compiled kernels shared), for weight_routes

    # ------------------------------------------------------------------ helpers
    def _check_operand(self, op: FP4Operand, name: str, vec: int) -> None:
        check_cuda(op.packed, f"{name}.packed")
        check_align(op.packed, f"{name}.packed", vec)
        check_align(op.scales, f"{name}.scales", 4)

    def _run(self, launch: Launch, a: FP4Operand, b: FP4Operand, b_scales: torch.Tensor,
             a_scales: torch.Tensor, alpha_a: torch.Tensor, alpha_b: torch.Tensor,
             offsets: torch.Tensor | None, m: int, n: int, k: int, e: int, out: torch.Tensor,
             limit: float | None) -> None:
        cfg = launch.cfg
        expect(launch.grid_y <= 65535, "weight tiles (grid.y)", "<= 65535", launch.grid_y)
        expect(launch.workspace_floats <= INT32_MAX, "split-K workspace", "< 2^31 floats",
               launch.workspace_floats)
        exe = self._gemms.get((ARCH, cfg), lambda: compile_gemm(cfg))
        dev = out.device
        ws, cnt = self._split_k_buffers(launch.splits, launch.workspace_floats, launch.tiles, dev, alpha_b)
        offs = offsets if offsets is not None else alpha_b
        tensors = (a.packed, a_scales, b.packed, b_scales, alpha_a, alpha_b, offs, out, ws, cnt)
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, gemm_arg_types(cfg))]
        exe(*ptrs, m, n, k, e, launch.grid_x, launch.grid_y, launch.splits,
            float(limit) if limit is not None else 0.0, cu_stream(dev))

    def _decoder(self):
        if self._decode_gemm is None:
            from .decode_launch import DecodeGemm

            self._decode_gemm = DecodeGemm(self.device)
        return self._decode_gemm

    def _prefill(self):
        if self._prefill_gemm is None:
            from .prefill_gemm import PrefillGemm

            self._prefill_gemm = PrefillGemm(self.device)
        return self._prefill_gemm

    def weight_routes(self) -> list[tuple[str, object]]:
        """``(label, gemm)`` for each kernel that reads a dense weight at prefill sizes, forced, so the weight
        audit (``parity.audit.weights``) sees every one: the generic kernel, and while the prefill route is
        on, ``PrefillGemm`` (a request it cannot take goes to the generic kernel, as a real call does).
        The decode kernel (M <= 16) is left to the per-call audit: auditing it exactly would take K / 16
        passes over each weight."""
        if self._generic is None:
            self._generic = Sm90Backend(self.device, routes=False)
        generic = self._generic
        routes: list[tuple[str, object]] = [("generic kernel", generic.gemm)]
        if self.routes and prefill_route.PREFILL_ROUTE:
            def prefill(req: GemmRequest) -> torch.Tensor:
                req.validate()
                pg = self._prefill()
                return pg(req, validated=True) if pg.supports(req) else generic.gemm(req)
            routes.append(("prefill route", prefill))
        return routes

    # ------------------------------------------------------------------ contract methods
    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        a, b = req.a, req.b
        m, n, k = a.rows, b.rows, a.k
        if self.routes and use_decode_kernel(m, n, k):
            dg = self._decoder()
            if dg.supports(req):  # else (unaligned packed data) the generic kernel
                return dg(req, validated=True)
        if self.routes and use_prefill_gemm(m, n, k):
            pg = self._prefill()
            if pg.supports(req):  # else (unaligned data, a weight too large to copy) the generic kernel
                return pg(req, validated=True)
        launch = dense_launch(m, n, k, swiglu=req.swiglu_limit is not None, num_sms=self._sms())
        self._check_operand(a, "a", launch.cfg.vec_bytes)
        self._check_operand(b, "b", launch.cfg.vec_bytes)
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        if m == 0:
            return out
        self._run(launch, a, b, kernel_scales(b), kernel_scales(a), a.global_scale,
                  b.global_scale, None, m, n, k, 1, out, req.swiglu_limit)
        return out

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor:
        """``check_values=False`` (implied while capturing a CUDA graph) skips the contract's checks
        that read device memory on the host (offsets, alphas): for tensors validated before."""
        req.validate(check_values=check_values and not capturing())
        a, b = req.a, req.b
        e, n, k, m = req.num_experts, req.n_per_expert, a.k, a.rows
        if self.routes and use_decode_kernel_grouped(m, e, n, k):
            dg = self._decoder()
            if dg.supports_grouped(req):
                return dg.grouped(req, validated=True)
        launch = grouped_launch(m, e, n, k, swiglu=req.swiglu_limit is not None, num_sms=self._sms())
        self._check_operand(a, "a", launch.cfg.vec_bytes)
        self._check_operand(b, "b", launch.cfg.vec_bytes)
        expect(req.offsets.is_contiguous() and req.alphas.is_contiguous(), "offsets / alphas",
               "contiguous tensors", "a strided view")
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a.device)
        if m == 0:
            return out
        self._run(launch, a, b, kernel_scales(b, groups=e), kernel_scales(a), req.alphas,
                  req.alphas, req.offsets, m, n, k, e, out, req.swiglu_limit)
        return out

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        return self._act.run(req, check_values=check_values)
