"""Activation quantization BF16 ``[M, K]`` -> NVFP4, optionally fused with RMSNorm (sm_90a and sm_100a).

Bit-faithful to :func:`dsv4.numerics.nvfp4_quantize` (recipes ``"exact"`` and ``"rcp"``): every step
is an IEEE-rounded FP32 operation in the oracle's order (``div.rn.f32`` / ``rcp.rn.f32``, never
``.approx``), E4M3 rounding by ``cvt.rn.satfinite.e4m3x2.f32`` (RNE, saturating at 448, NaN kept),
E2M1 rounding by comparisons against the oracle's decision bounds (ties to the even code, NaN ->
code 7, sign bit kept so -0 -> code 8, zero block scale -> all codes 0). No FP4 ``cvt`` is used, so
the same code runs on Hopper.

One CTA per row, 128 threads, each thread one 16-element block at a time. With a runtime global
scale, a first kernel reduces ``amax`` (atomic max on the FP32 bit pattern, valid for values >= 0;
NaN propagates because its pattern is the largest) and the quantize kernel derives
``g = max(amax / 2688, 2^-126)``. The fused RMSNorm (``(x * rsqrt(mean(x^2) + eps)) * w`` in FP32)
recomputes the row's sum of squares in a fixed order in both kernels, so both see identical values;
its reduction order differs from torch's, so fused results may differ from the oracle in the last
FP32 bit of the normalized value (tests bound that separately).
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from .scale_offsets import swizzled_scale_offset

THREADS = 128
FP4_AMAX_PER_GLOBAL = 2688.0  # 6 * 448
FP32_MIN_NORMAL = 2.0 ** -126
# oracle e2m1_encode bounds: (bound, tie rounds up to the even code)
E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


@dataclass(frozen=True)
class ActQuantConfig:
    rms: bool
    rms_weight_f32: bool  # weight dtype: FP32 (True) or BF16 (False)
    runtime_scale: bool
    swizzled: bool
    recipe: str  # "exact" | "rcp"


# ---------------------------------------------------------------------------- PTX helpers
def _ld_v4(addr: Int64):
    return inline_ptx("ld.global.nc.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                      write_only_types=[Uint32] * 4, read_only_args=[addr])


def _bits(f: Float32) -> Uint32:
    return inline_ptx("mov.b32 {$w0}, {$r0};", write_only_types=[Uint32], read_only_args=[f])


def _from_bits(u: Uint32) -> Float32:
    return inline_ptx("mov.b32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[u])


def _e4m3_rne(sf: Float32) -> Uint32:
    """FP32 -> E4M3 byte (RNE, satfinite: |x| > 448 -> 448, NaN -> 0x7F) in the low byte."""
    return inline_ptx("""{
.reg .b16 h;
cvt.rn.satfinite.e4m3x2.f32 h, 0f00000000, {$r0};
cvt.u32.u16 {$w0}, h;
}""", write_only_types=[Uint32], read_only_args=[sf])


def _e4m3_value(byte: Uint32) -> Float32:
    """E4M3 byte -> FP32 (exact, via f16)."""
    return inline_ptx("""{
.reg .b16 lo, hi, h;
.reg .b32 d;
mov.b32 {lo, hi}, {$r0};
cvt.rn.f16x2.e4m3x2 d, lo;
mov.b32 {h, hi}, d;
cvt.f32.f16 {$w0}, h;
}""", write_only_types=[Float32], read_only_args=[byte])


def _st_v2(addr: Int64, w0: Uint32, w1: Uint32) -> None:
    inline_ptx("st.global.v2.b32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, w0, w1])


def _st_u8(addr: Int64, b: Uint32) -> None:
    inline_ptx("""{
.reg .b16 h;
cvt.u16.u32 h, {$r1};
st.global.b8 [{$r0}], h;
}""", read_only_args=[addr, b])


class ActQuantKernels:
    """``amax_launch`` (runtime scale only) and ``quant_launch``; both ``@cute.jit`` launchers."""

    def __init__(self, cfg: ActQuantConfig):
        assert cfg.recipe in ("exact", "rcp"), cfg.recipe
        self.cfg = cfg

    # ------------------------------------------------------------------ shared device pieces
    @cute.jit
    def _load_block(self, x_base, w_base, row, blk, k, rstd):
        """16 FP32 values of block ``blk`` of ``row``: BF16 -> FP32 (exact), then ``(x*rstd)*w``."""
        cfg = self.cfg
        addr = x_base + (Int64(row) * Int64(k) + Int64(blk * 16)) * Int64(2)
        a0, a1, a2, a3 = _ld_v4(addr)
        a4, a5, a6, a7 = _ld_v4(addr + Int64(16))
        words = (a0, a1, a2, a3, a4, a5, a6, a7)
        vals = []
        for i in cutlass.range_constexpr(8):
            vals.append(_from_bits(words[i] << 16))
            vals.append(_from_bits(words[i] & Uint32(0xFFFF0000)))
        if cutlass.const_expr(cfg.rms):
            wv = []
            if cutlass.const_expr(cfg.rms_weight_f32):
                waddr = w_base + Int64(blk * 16) * Int64(4)
                for q in cutlass.range_constexpr(4):
                    b0, b1, b2, b3 = _ld_v4(waddr + Int64(16 * q))
                    wv += [_from_bits(b0), _from_bits(b1), _from_bits(b2), _from_bits(b3)]
            else:
                waddr = w_base + Int64(blk * 16) * Int64(2)
                b0, b1, b2, b3 = _ld_v4(waddr)
                b4, b5, b6, b7 = _ld_v4(waddr + Int64(16))
                for bw in (b0, b1, b2, b3, b4, b5, b6, b7):
                    wv.append(_from_bits(bw << 16))
                    wv.append(_from_bits(bw & Uint32(0xFFFF0000)))
            for i in cutlass.range_constexpr(16):
                vals[i] = (vals[i] * rstd) * wv[i]
        return vals

    @cute.jit
    def _row_rstd(self, x_base, row, k, eps, tid, red):
        """``rsqrt(sum(x^2)/K + eps)`` with a fixed summation order (per thread, then warps in
        order); ``1/sqrt`` with IEEE ``sqrt.rn`` and ``div.rn``."""
        nb = k // 16
        ss = Float32(0.0)
        for blk in cutlass.range(tid, nb, THREADS, unroll=1):
            addr = x_base + (Int64(row) * Int64(k) + Int64(blk * 16)) * Int64(2)
            a0, a1, a2, a3 = _ld_v4(addr)
            a4, a5, a6, a7 = _ld_v4(addr + Int64(16))
            for w in (a0, a1, a2, a3, a4, a5, a6, a7):
                lo = _from_bits(w << 16)
                hi = _from_bits(w & Uint32(0xFFFF0000))
                ss = ss + lo * lo
                ss = ss + hi * hi
        for sh in cutlass.range_constexpr(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, 16 >> sh)
        lane = tid % 32
        warp = tid // 32
        if lane == 0:
            red[warp] = ss
        cute.arch.sync_threads()
        tot = Float32(0.0)
        for w in cutlass.range_constexpr(THREADS // 32):
            tot = tot + red[w]
        cute.arch.sync_threads()
        mean = tot / Float32(k)
        return Float32(1.0) / cute.math.sqrt(mean + eps)

    # ------------------------------------------------------------------ pass 1: amax
    @cute.jit
    def amax_launch(self, x: cute.Pointer, w: cute.Pointer, amax: cute.Pointer, m: Int32, k: Int32,
                    eps: Float32, stream):
        self.amax_kernel(x, w, amax, k, eps).launch(grid=[m, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def amax_kernel(self, x: cute.Pointer, w: cute.Pointer, amax: cute.Pointer, k: Int32, eps: Float32):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32), 16)
        x_base = x.toint()
        w_base = w.toint()
        rstd = Float32(1.0)
        if cutlass.const_expr(cfg.rms):
            rstd = self._row_rstd(x_base, row, k, eps, tid, red)
        mx = Uint32(0)  # max over |y| as bit patterns (monotonic for non-negative floats, NaN largest)
        for blk in cutlass.range(tid, k // 16, THREADS, unroll=1):
            vals = self._load_block(x_base, w_base, row, blk, k, rstd)
            for i in cutlass.range_constexpr(16):
                mx = cutlass.max(mx, _bits(vals[i]) & Uint32(0x7FFFFFFF))
        for sh in cutlass.range_constexpr(5):
            mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, 16 >> sh))
        if tid % 32 == 0:
            cute.arch.atomic_max(amax, mx)

    # ------------------------------------------------------------------ pass 2: quantize
    @cute.jit
    def quant_launch(self, x: cute.Pointer, w: cute.Pointer, g_in: cute.Pointer, amax: cute.Pointer,
                     packed: cute.Pointer, scales: cute.Pointer, g_out: cute.Pointer, m: Int32,
                     k: Int32, grid_rows: Int32, eps: Float32, stream):
        self.quant_kernel(x, w, g_in, amax, packed, scales, g_out, m, k, eps).launch(
            grid=[grid_rows, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def quant_kernel(self, x: cute.Pointer, w: cute.Pointer, g_in: cute.Pointer, amax: cute.Pointer,
                     packed: cute.Pointer, scales: cute.Pointer, g_out: cute.Pointer, m: Int32,
                     k: Int32, eps: Float32):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout(THREADS // 32), 16)
        x_base = x.toint()
        w_base = w.toint()
        nb = k // 16
        sc_pad = (nb + 3) // 4 * 4

        g = Float32(0.0)
        if cutlass.const_expr(cfg.runtime_scale):
            am_bits = cute.make_tensor(amax, cute.make_layout(1))[0]
            am = _from_bits(am_bits)
            g = cutlass.max(am / Float32(FP4_AMAX_PER_GLOBAL), Float32(FP32_MIN_NORMAL))
            if am_bits >= Uint32(0x7F800000):  # amax Inf/NaN -> g = NaN (oracle)
                g = _from_bits(Uint32(0x7FC00000))
            if row == 0 and tid == 0:
                cute.make_tensor(g_out, cute.make_layout(1))[0] = g
        else:
            g = cute.make_tensor(g_in, cute.make_layout(1))[0]
        six_g = g * Float32(6.0)
        inv_six_g = Float32(1.0) / six_g

        if row < m:
            rstd = Float32(1.0)
            if cutlass.const_expr(cfg.rms):
                rstd = self._row_rstd(x_base, row, k, eps, tid, red)
            for blk in cutlass.range(tid, nb, THREADS, unroll=1):
                vals = self._load_block(x_base, w_base, row, blk, k, rstd)
                self._quant_block(vals, g, six_g, inv_six_g, packed, scales, row, blk, k, sc_pad)
        if cutlass.const_expr(cfg.swizzled):
            # zero the padding of the 32_4_4 layout: columns nb..sc_pad of this row, and whole
            # padded rows (CTAs row >= m; the grid covers round_up(m, 128) rows)
            c0 = nb
            if row >= m:
                c0 = 0
            for c in cutlass.range(c0 + tid, sc_pad, THREADS, unroll=1):
                _st_u8(scales.toint() + Int64(self._swz(row, c, sc_pad)), Uint32(0))

    @cute.jit
    def _swz(self, row, col, sc_pad):
        return swizzled_scale_offset(row, col, sc_pad)

    @cute.jit
    def _quant_block(self, vals, g, six_g, inv_six_g, packed, scales, row, blk, k, sc_pad):
        cfg = self.cfg
        amax_b = Float32(0.0)
        nan_seen = Boolean(False)
        for i in cutlass.range_constexpr(16):
            a = cute.math.abs(vals[i])
            amax_b = cutlass.max(amax_b, a)
            nan_seen = nan_seen | (a != a)
        sf = Float32(0.0)
        if cutlass.const_expr(cfg.recipe == "exact"):
            sf = amax_b / six_g
        else:
            sf = amax_b * inv_six_g
        if nan_seen or amax_b == Float32(float("inf")):  # non-finite block -> NaN scale (0x7F)
            sf = _from_bits(Uint32(0x7FC00000))
        sbyte = _e4m3_rne(sf)
        sval = _e4m3_value(sbyte)
        denom = sval * g
        inv_denom = Float32(1.0) / denom
        w0 = Uint32(0)
        w1 = Uint32(0)
        for i in cutlass.range_constexpr(16):
            v = Float32(0.0)
            if cutlass.const_expr(cfg.recipe == "exact"):
                v = vals[i] / denom
            else:
                v = vals[i] * inv_denom
            a = cute.math.abs(v)
            code = Uint32(0)
            for bound, tie_up in E2M1_BOUNDS:
                if cutlass.const_expr(tie_up):
                    if a >= Float32(bound):
                        code = code + Uint32(1)
                else:
                    if a > Float32(bound):
                        code = code + Uint32(1)
            if v != v:
                code = Uint32(7)
            else:
                code = code | ((_bits(v) >> 28) & Uint32(8))
            if sval == Float32(0.0):
                code = Uint32(0)
            if cutlass.const_expr(i < 8):
                w0 = w0 | (code << (4 * i))
            else:
                w1 = w1 | (code << (4 * (i - 8)))
        _st_v2(packed.toint() + Int64(row) * Int64(k // 2) + Int64(blk * 8), w0, w1)
        soff = Int64(row) * Int64(k // 16) + Int64(blk)
        if cutlass.const_expr(cfg.swizzled):
            soff = Int64(self._swz(row, blk, sc_pad))
        _st_u8(scales.toint() + soff, sbyte)
