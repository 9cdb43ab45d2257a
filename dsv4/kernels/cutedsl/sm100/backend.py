"""``Sm100Backend``: the contract's requests -> validated, packed launch arguments -> the sm_100a kernel.

``prepare_gemm`` / ``prepare_grouped`` do all host-side work (contract validation, TMA constraints,
scale swizzling at the edge, the SwiGLU view of B, alphas, the grouped tile schedule, output
allocation) in plain torch on whatever device the tensors live on, so CPU tests cover them.
``gemm`` / ``grouped_gemm`` add the device check, fetch the compiled executor from the cache and
launch. This module does not import ``cutlass``; ``launch.py`` is loaded on the first launch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import (ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest,
                         KernelContractError)
from ..common import KernelCache, check_cuda, expect
from .device_schedule import device_grouped_schedule
from .layout import (TILE_M, KernelConfig, choose_config, launch_problems, swizzled_scales,
                     weight_scale_view)

ARCH_MAJOR = 10  # tcgen05 block-scaled MMAs: sm_100a / sm_103a
DTYPES = "e2m1.e4m3x16.bf16"  # operand / scale / output types: part of every cache key


@dataclass(frozen=True)
class LaunchArgs:
    """Everything one launch needs. ``b`` is viewed by the kernel as ``lb`` batches of ``nb`` rows;
    ``sfa`` / ``sfb`` are flat 32_4_4 bytes (``sfb`` per batch); ``sched`` is int32 ``[W, 4]``
    (grouped) or an unused ``[1, 4]`` placeholder (dense); ``num_work`` = grid x."""

    cfg: KernelConfig
    a: torch.Tensor
    b: torch.Tensor
    sfa: torch.Tensor
    sfb: torch.Tensor
    alpha: torch.Tensor
    sched: torch.Tensor
    out: torch.Tensor
    m: int
    nb: int
    k: int
    lb: int
    num_work: int
    swiglu_limit: float

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.num_work, -(-self.nb // self.cfg.bn), 1


def _check_launchable(m: int, nb: int, k: int, **tensors: torch.Tensor) -> None:
    problems = launch_problems(m, nb, k, tensors)
    if problems:
        raise KernelContractError("; ".join(problems))


class Sm100Backend:
    """NVFP4 GEMMs on sm_100a (B200) through CuTe DSL ``tcgen05`` block-scaled kernels."""

    name = "cutedsl_sm100"

    def __init__(self, device: str | torch.device = "cuda", *, routes: bool = True):
        """``routes=False``: every dense GEMM through the generic kernel (``decode_route`` decides otherwise)."""
        self.device = torch.device(device)
        self.routes = routes
        self.cache = KernelCache(scope=("sm100-gemm", str(self.device)))   # shared by every load in the process
        self._act_quant: dict[str, object] = {}  # arch -> ActQuantRunner (its own compile cache)
        self._decode_gemm = None  # DecodeGemm100, built on the first decode-sized call
        self._grouped_decode_gemm = None  # GroupedDecodeGemm100, likewise (its route is off by default)

    def route(self, req: GemmRequest) -> str:
        """``"decode kernel"`` or ``"generic kernel"``: which kernel :meth:`gemm` gives a valid request
        (pure: no device needed). A request the decode kernel cannot take (unaligned packed data) goes
        to the generic kernel."""
        from .decode_launch import DecodeGemm100
        from .decode_route import use_decode_kernel

        if self.routes and use_decode_kernel(req.a.rows, req.b.rows, req.a.k) and DecodeGemm100.supports(req):
            return "decode kernel"
        return "generic kernel"

    def route_grouped(self, req: GroupedGemmRequest) -> str:
        """``"grouped decode kernel"`` or ``"generic kernel"``: which kernel :meth:`grouped_gemm` gives a
        valid request (pure). Generic unless ``decode_route.GROUPED_DECODE_ROUTE`` is on (off by default)."""
        from . import decode_route

        if not (self.routes and decode_route.GROUPED_DECODE_ROUTE):  # off: the request is not even read
            return "generic kernel"
        if decode_route.use_grouped_decode_kernel(req.a.rows, req.num_experts, req.a.k):
            from .grouped_decode_launch import GroupedDecodeGemm100

            if GroupedDecodeGemm100.supports(req):
                return "grouped decode kernel"
        return "generic kernel"

    def _decoder(self):
        if self._decode_gemm is None:
            from .decode_launch import DecodeGemm100

            self._decode_gemm = DecodeGemm100(self.device)
        return self._decode_gemm

    # ---- host-side packing (device-agnostic) ----------------------------------------------------
    def prepare_gemm(self, req: GemmRequest) -> LaunchArgs:
        req.validate()
        return self._prepare_gemm(req)

    def prepare_grouped(self, req: GroupedGemmRequest) -> LaunchArgs:
        req.validate()
        return self._prepare_grouped(req)

    def _prepare_gemm(self, req: GemmRequest) -> LaunchArgs:
        a, b, swiglu = req.a, req.b, req.swiglu_limit is not None
        sfa = swizzled_scales(a.scales, a.scale_layout, a.rows, a.k)
        sfb, nb, lb = weight_scale_view(b, 1, swiglu)
        _check_launchable(a.rows, nb, a.k, a=a.packed, b=b.packed, a_scales=sfa, b_scales=sfb)
        dev = a.device
        return LaunchArgs(
            cfg=choose_config(a.rows, nb, swiglu=swiglu, grouped=False), a=a.packed, b=b.packed,
            sfa=sfa, sfb=sfb, alpha=(a.global_scale * b.global_scale).reshape(1),
            sched=torch.empty(1, 4, dtype=torch.int32, device=dev),  # never read by the dense kernel
            out=torch.empty(a.rows, nb, dtype=torch.bfloat16, device=dev), m=a.rows, nb=nb, k=a.k,
            lb=lb, num_work=-(-a.rows // TILE_M), swiglu_limit=float(req.swiglu_limit or 0.0))

    def _prepare_grouped(self, req: GroupedGemmRequest) -> LaunchArgs:
        a, b, e, swiglu = req.a, req.b, req.num_experts, req.swiglu_limit is not None
        sfa = swizzled_scales(a.scales, a.scale_layout, a.rows, a.k)
        sfb, nb, lb = weight_scale_view(b, e, swiglu)
        _check_launchable(a.rows, nb, a.k, a=a.packed, b=b.packed, a_scales=sfa, b_scales=sfb)
        # The schedule is built on the device, its length fixed by M and E: no host read of the offsets,
        # so the call can be captured in a CUDA graph (device_schedule.py; validate() reads them only
        # with check_values)
        sched = device_grouped_schedule(req.offsets.to(a.device), a.rows)
        return LaunchArgs(
            cfg=choose_config(a.rows, nb, swiglu=swiglu, grouped=True), a=a.packed, b=b.packed,
            sfa=sfa, sfb=sfb, alpha=req.alphas.contiguous(), sched=sched,
            out=torch.empty(a.rows, nb, dtype=torch.bfloat16, device=a.device), m=a.rows, nb=nb,
            k=a.k, lb=lb, num_work=int(sched.shape[0]), swiglu_limit=float(req.swiglu_limit or 0.0))

    # ---- launches --------------------------------------------------------------------------------
    def _check_device(self, t: torch.Tensor) -> str:
        check_cuda(t, "operands")
        cap = torch.cuda.get_device_capability(t.device)
        expect(cap[0] == ARCH_MAJOR, "device compute capability", f"({ARCH_MAJOR}, x) (sm_100a family)", cap)
        return f"sm_{cap[0]}{cap[1]}a"

    def _run(self, args: LaunchArgs, arch: str) -> torch.Tensor:
        if args.m == 0 or args.num_work == 0 or args.nb == 0:
            return args.out  # nothing to compute; a zero-sized grid is not launchable
        from . import launch  # imports cutlass

        exe = self.cache.get((arch, args.cfg, DTYPES, "swiglu" if args.cfg.swiglu else "alpha"),
                             lambda: launch.compile_kernel(args.cfg, arch))
        launch.launch(exe, args)
        return args.out

    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        if self.route(req) == "decode kernel":
            return self._decoder()(req, validated=True)   # it checks the device itself
        arch = self._check_device(req.a.packed)
        return self._run(self._prepare_gemm(req), arch)

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor:
        if self.route_grouped(req) == "grouped decode kernel":  # it validates (graph-capture safe)
            if self._grouped_decode_gemm is None:
                from .grouped_decode_launch import GroupedDecodeGemm100

                self._grouped_decode_gemm = GroupedDecodeGemm100(self.device)
            return self._grouped_decode_gemm(req, check_values=check_values)
        req.validate(check_values=check_values)
        arch = self._check_device(req.a.packed)
        return self._run(self._prepare_grouped(req), arch)

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        """The shared CuTe DSL quantizer (``cutedsl/act_quant.py``), compiled for this device's arch."""
        req.validate(check_values=check_values)
        arch = self._check_device(req.x)
        if arch not in self._act_quant:
            from ..act_quant_host import ActQuantRunner  # imports cutlass

            self._act_quant[arch] = ActQuantRunner(arch)
        return self._act_quant[arch].run(req, check_values=check_values)
