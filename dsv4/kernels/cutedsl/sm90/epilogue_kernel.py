"""The prefill route's epilogue in one pass (sm_90a): FP32 GEMM output -> ``alpha * y`` -> optional SwiGLU ->
BF16, the arithmetic of the generic kernel's ``_store`` (``gemm_kernel.py``), element for element.

``alpha = a.global * b.global`` is formed in the kernel from the two device scalars (no host read, so the
form is CUDA-graph safe). SwiGLU reads ``[gate (n_out columns); up (n_out columns)]`` per row:
``gate = min(alpha*g, L)``, ``up = max(min(alpha*u, L), -L)``, ``out = gate * (1 / (1 + exp(-gate))) * up``.
One thread handles 4 consecutive outputs per iteration (16-byte loads, an 8-byte store): ``n_out % 4 == 0``.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

THREADS = 256


@dataclass(frozen=True)
class EpilogueConfig:
    swiglu: bool


def _ld_v4_f32(addr: Int64):
    return inline_ptx("ld.global.nc.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Float32] * 4,
                      read_only_args=[addr])


def _bf16x2(lo: Float32, hi: Float32) -> Uint32:
    return inline_ptx("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", write_only_types=[Uint32], read_only_args=[lo, hi])


def _st_v2(addr: Int64, w0: Uint32, w1: Uint32) -> None:
    inline_ptx("st.global.v2.b32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, w0, w1])


class Sm90Epilogue:
    """``launch(y, alpha_a, alpha_b, out, m, n_out, limit, grid, stream)``."""

    def __init__(self, cfg: EpilogueConfig):
        self.cfg = cfg

    @cute.jit
    def launch(self, y: cute.Pointer, alpha_a: cute.Pointer, alpha_b: cute.Pointer, out: cute.Pointer, m: Int32,
               n_out: Int32, limit: Float32, grid: Int32, stream):
        self.kernel(y, alpha_a, alpha_b, out, m, n_out, limit).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1],
                                                                      stream=stream)

    @cute.kernel
    def kernel(self, y: cute.Pointer, alpha_a: cute.Pointer, alpha_b: cute.Pointer, out: cute.Pointer, m: Int32,
               n_out: Int32, limit: Float32):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nbid, _, _ = cute.arch.grid_dim()
        alpha = (cute.make_tensor(alpha_a, cute.make_layout(1))[0]
                 * cute.make_tensor(alpha_b, cute.make_layout(1))[0])
        q = n_out // 4
        ld = n_out
        if cutlass.const_expr(cfg.swiglu):
            ld = n_out * 2
        y_base = y.toint()
        o_base = out.toint()
        for idx in cutlass.range(bid * THREADS + tid, m * q, nbid * THREADS, unroll=1):
            row = idx // q
            c = (idx - row * q) * 4
            g = _ld_v4_f32(y_base + (Int64(row) * Int64(ld) + Int64(c)) * Int64(4))
            vals = [g[0] * alpha, g[1] * alpha, g[2] * alpha, g[3] * alpha]
            if cutlass.const_expr(cfg.swiglu):
                u = _ld_v4_f32(y_base + (Int64(row) * Int64(ld) + Int64(n_out + c)) * Int64(4))
                for i in cutlass.range_constexpr(4):
                    gate = cutlass.min(vals[i], limit)
                    up = cutlass.max(cutlass.min(u[i] * alpha, limit), -limit)
                    sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-gate))
                    vals[i] = gate * sig * up
            _st_v2(o_base + (Int64(row) * Int64(n_out) + Int64(c)) * Int64(2), _bf16x2(vals[0], vals[1]),
                   _bf16x2(vals[2], vals[3]))


def epilogue_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm90Epilogue.launch``, in order."""
    return [(cutlass.Float32, 16), (cutlass.Float32, 4), (cutlass.Float32, 4), (cutlass.BFloat16, 8)]


def compile_epilogue(cfg: EpilogueConfig, arch: str = "sm_90a", *, keep_ptx: bool = False):
    """Compile with placeholder pointers; M, n_out, the limit and the grid are runtime arguments."""
    from ..common import compile_placeholder

    return compile_placeholder(Sm90Epilogue(cfg).launch, epilogue_arg_types(),
                               (Int32(1), Int32(4), Float32(1.0), Int32(1)), arch=arch, keep_ptx=keep_ptx)


EPILOGUE_REQUIRED = [r"cvt\.rn\.bf16x2\.f32", r"ld\.global\.nc\.v4\.f32", r"st\.global\.v2\.b32"]
EPILOGUE_FORBIDDEN = [r"div\.approx", r"cvt\.[a-z0-9.]*e2m1x2", r"tcgen05"]


def epilogue_builds(arch: str = "sm_90a"):
    """Pre-flight builds (``KernelBuild``) of both forms."""
    from ..common import check_build

    return [check_build(f"prefill_epilogue{'_swiglu' if sw else ''}", arch,
                        lambda sw=sw: compile_epilogue(EpilogueConfig(sw), arch, keep_ptx=True),
                        EPILOGUE_REQUIRED, EPILOGUE_FORBIDDEN) for sw in (False, True)]
