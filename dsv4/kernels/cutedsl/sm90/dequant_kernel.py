"""FP4 -> BF16 block dequantization on sm_90a: the first step of the prefill GEMM route (``prefill_gemm``).

``out[r, k] = e2m1(code[r, k]) * e4m3(scale[r, k // 16])`` in BF16, exactly: the product has at most
6 significant bits and lies in [2^-10, 2688], inside FP16 (where ``DECODE8_PAIRS`` forms it with
``mul.rn.f16x2``, exact) and BF16 (the FP16 -> FP32 -> BF16 conversions are exact for such values).
NaN scales give NaN, ``-0`` codes give ``-0``: the values of ``dsv4.numerics.nvfp4_dequantize`` with a
global scale of 1.0 (the global scales are applied after the GEMM, in FP32).

One thread per 16-element block (8 packed bytes, one scale byte, 32 output bytes), blocks in row-major
order over a grid-stride loop, so consecutive threads read and write consecutive memory. Scales are
``linear`` ``[rows, K/16]`` or the 32_4_4 ``swizzled`` layout of one matrix.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from ..scale_offsets import swizzled_scale_offset
from .decode_ptx import decode_e2m1x8_pairs, e4m3x2_to_f16x2_bcast

THREADS = 256


@dataclass(frozen=True)
class DequantConfig:
    swizzled: bool


def _ld_v2(addr: Int64):
    return inline_ptx("ld.global.nc.v2.b32 {{$w0}, {$w1}}, [{$r0}];", write_only_types=[Uint32] * 2,
                      read_only_args=[addr])


def _ld_u8(addr: Int64) -> Uint32:
    return inline_ptx("ld.global.nc.u8 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def _st_v4(addr: Int64, w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32) -> None:
    inline_ptx("st.global.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, w0, w1, w2, w3])


def _f16x2_to_bf16x2(h: Uint32) -> Uint32:
    """An f16x2 word -> the bf16x2 word of the same two values (exact for <= 8 significant bits)."""
    return inline_ptx("""{
.reg .b16 lo, hi;
.reg .f32 a, b;
mov.b32 {lo, hi}, {$r0};
cvt.f32.f16 a, lo;
cvt.f32.f16 b, hi;
cvt.rn.bf16x2.f32 {$w0}, b, a;
}""", write_only_types=[Uint32], read_only_args=[h])


class Sm90Dequant:
    """``launch(packed, scales, out, rows, k, grid, stream)``: ``rows * k / 16`` blocks, ``grid`` CTAs."""

    def __init__(self, cfg: DequantConfig):
        self.cfg = cfg

    @cute.jit
    def launch(self, packed: cute.Pointer, scales: cute.Pointer, out: cute.Pointer, rows: Int32, k: Int32,
               grid: Int32, stream):
        self.kernel(packed, scales, out, rows, k).launch(grid=[grid, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, packed: cute.Pointer, scales: cute.Pointer, out: cute.Pointer, rows: Int32, k: Int32):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        nbid, _, _ = cute.arch.grid_dim()
        nbk = k // 16
        sc_pad = (nbk + 3) // 4 * 4
        total = rows * nbk  # < 2^31: checked on the host
        p_base = packed.toint()
        s_base = scales.toint()
        o_base = out.toint()
        for idx in cutlass.range(bid * THREADS + tid, total, nbid * THREADS, unroll=1):
            w0, w1 = _ld_v2(p_base + Int64(idx) * Int64(8))
            soff = Int64(idx)
            if cutlass.const_expr(cfg.swizzled):
                row = idx // nbk
                blk = idx - row * nbk
                soff = Int64(swizzled_scale_offset(row, blk, sc_pad))
            sc2, _ = e4m3x2_to_f16x2_bcast(_ld_u8(s_base + soff))
            h0, h1, h2, h3 = decode_e2m1x8_pairs(w0, sc2)
            h4, h5, h6, h7 = decode_e2m1x8_pairs(w1, sc2)
            o = o_base + Int64(idx) * Int64(32)
            _st_v4(o, _f16x2_to_bf16x2(h0), _f16x2_to_bf16x2(h1), _f16x2_to_bf16x2(h2), _f16x2_to_bf16x2(h3))
            _st_v4(o + Int64(16), _f16x2_to_bf16x2(h4), _f16x2_to_bf16x2(h5), _f16x2_to_bf16x2(h6),
                   _f16x2_to_bf16x2(h7))


def dequant_arg_types():
    """(dtype, assumed alignment) of the pointer arguments of ``Sm90Dequant.launch``, in order."""
    return [(cutlass.Uint8, 8), (cutlass.Uint8, 1), (cutlass.BFloat16, 16)]


def compile_dequant(cfg: DequantConfig, arch: str = "sm_90a", *, keep_ptx: bool = False):
    """Compile with placeholder pointers; rows, K and the grid are runtime arguments."""
    from ..common import compile_placeholder

    return compile_placeholder(Sm90Dequant(cfg).launch, dequant_arg_types(), (Int32(1), Int32(16), Int32(1)),
                               arch=arch, keep_ptx=keep_ptx)


# Exact conversions only: the f16x2 block-scale multiply round-to-nearest without flush, no FP4 cvt
# (absent on sm_90a), no approximate arithmetic.
DEQUANT_REQUIRED = [r"mul\.rn\.f16x2", r"cvt\.rn\.bf16x2\.f32", r"cvt\.rn\.f16x2\.e4m3x2", r"st\.global\.v4\.b32"]
DEQUANT_FORBIDDEN = [r"cvt\.[a-z0-9.]*e2m1x2", r"\.approx", r"mul\.[a-z0-9.]*ftz[a-z0-9.]*f16x2"]


def dequant_builds(arch: str = "sm_90a"):
    """Pre-flight builds (``KernelBuild``) of both scale layouts."""
    from ..common import check_build

    return [check_build(f"dequant_bf16_{'swizzled' if sw else 'linear'}", arch,
                        lambda sw=sw: compile_dequant(DequantConfig(sw), arch, keep_ptx=True),
                        DEQUANT_REQUIRED, DEQUANT_FORBIDDEN) for sw in (False, True)]
