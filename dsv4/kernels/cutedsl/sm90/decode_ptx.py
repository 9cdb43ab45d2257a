"""Inline-PTX helpers of the sm_90a decode GEMM (``decode_gemm_kernel.py``): mbarriers, 1-D bulk
async copies (TMA engine, ``cp.async.bulk``), ``cp.async`` completion tracked by an mbarrier, and
the warp-level ``mma.sync.m16n8k16`` with FP16 operands and FP32 accumulation.

Shared-memory addresses are 32-bit (``Int32``) ``.shared`` addresses, as in ``ptx.py``; global ones
are 64-bit generic addresses. Labels inside ``{ }`` blocks are local to the block, so the wait loop
can be inlined many times.
"""
from __future__ import annotations

from cutlass import Float32, Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from .ptx import E2M1_F16_HI_HI, E2M1_F16_HI_LO


def mbar_init(bar: Int32, count: Int32) -> None:
    inline_ptx("mbarrier.init.shared::cta.b64 [{$r0}], {$r1};", read_only_args=[bar, count])


def fence_mbar_init() -> None:
    """Make mbarrier.init visible to the async proxy (bulk copies) before the CTA barrier."""
    inline_ptx("fence.mbarrier_init.release.cluster;")


def mbar_arrive_expect_tx(bar: Int32, tx_bytes: Int32) -> None:
    inline_ptx("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{$r0}], {$r1};", read_only_args=[bar, tx_bytes])


def mbar_arrive(bar: Int32) -> None:
    inline_ptx("mbarrier.arrive.shared::cta.b64 _, [{$r0}];", read_only_args=[bar])


def mbar_wait(bar: Int32, parity: Int32) -> None:
    """Spin (``try_wait`` suspends in hardware between polls) until phase ``parity`` completed."""
    inline_ptx("""{
.reg .pred p;
DSV4_MBAR_WAIT:
mbarrier.try_wait.parity.shared::cta.b64 p, [{$r0}], {$r1};
@!p bra DSV4_MBAR_WAIT;
}""", read_only_args=[bar, parity])


def cp_async_mbar_arrive_noinc(bar: Int32) -> None:
    """An arrive on ``bar`` once this thread's earlier ``cp.async`` copies have landed; counts as
    one of the barrier's expected arrivals (``.noinc``)."""
    inline_ptx("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{$r0}];", read_only_args=[bar])


def l2_evict_first() -> Int64:
    """L2 cache policy for data read once (the streamed weights)."""
    return inline_ptx("createpolicy.fractional.L2::evict_first.b64 {$w0}, 1.0;", write_only_types=[Int64])


def bulk_g2s_hint(dst: Int32, src: Int64, nbytes: Int32, bar: Int32, policy: Int64) -> None:
    """1-D bulk async copy global -> shared (16-byte aligned, size % 16 == 0), completion counted
    in bytes on ``bar``, with an L2 cache policy."""
    inline_ptx("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
               "[{$r0}], [{$r1}], {$r2}, [{$r3}], {$r4};", read_only_args=[dst, src, nbytes, bar, policy])


def bulk_g2s(dst: Int32, src: Int64, nbytes: Int32, bar: Int32) -> None:
    inline_ptx("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
               "[{$r0}], [{$r1}], {$r2}, [{$r3}];", read_only_args=[dst, src, nbytes, bar])


def st_shared_b32(addr: Int32, v: Uint32) -> None:
    inline_ptx("st.shared.b32 [{$r0}], {$r1};", read_only_args=[addr, v])


# E2M1 x8 -> FP16 by exponent rebias, 15 instructions (11 integer + 4 ``mul.rn.f16x2``; the table
# decode ``DECODE8_PAIRS`` takes 17, 13 of them integer). A code ``s e1 e0 m`` placed as the FP16
# half ``s 000 e1e0 m 0 00000000`` (sign at bit 15, e1e0 = the two low exponent bits 11..10, m = the
# top mantissa bit 9) is the E2M1 value times 2^-14 exactly: e1e0 >= 1 gives (1 + m/2) * 2^(e-15),
# e1e0 = 0 the subnormal m/2 * 2^-14. In byte terms the FP16 high byte is ``s000eem0``:
#  * odd codes (high nibble of a byte, bits 4..7): xo = x & 0xF0F0F0F0, then per byte
#    ((xo >> 3) | xo) & 0x8E = s000eem0 (xo >> 3 holds eem at 1..3 and nothing at 7; xo holds the
#    sign at 7 and nothing at 1..3) -- kept at bytes 1,3 (mask 0x8E008E00) it is the f16x2 word of
#    codes 3 and 7; kept at bytes 0,2 and shifted left by 8, the word of codes 1 and 5;
#  * even codes (low nibble): xe = x & 0x0F0F0F0F, ((xe << 1) | (xe << 4)) & 0x8E per byte, the
#    same way: words (2, 6) and (0, 4).
# Each word is then multiplied (``mul.rn.f16x2``) by the f16x2 block scale: the product
# e2m1 * scale * 2^-14 is exact in FP16 (at most 6 significant bits; the smallest nonzero one is
# 0.5 * 2^-9 * 2^-14 = 2^-24, the least FP16 subnormal; the largest 6 * 448 * 2^-14 < 0.17).
# Output order: (n3,n7 | n1,n5 | n2,n6 | n0,n4); lop3 immLut 0xA8 = (a | b) & c.
DECODE8_REBIAS = """{
.reg .b32 xo, xe, a, b, t;
and.b32 xo, {$r0}, 0xF0F0F0F0;
shr.u32 a, xo, 3;
lop3.b32 t, a, xo, 0x8E008E00, 0xA8;
mul.rn.f16x2 {$w0}, t, {$r1};
lop3.b32 t, a, xo, 0x008E008E, 0xA8;
shl.b32 t, t, 8;
mul.rn.f16x2 {$w1}, t, {$r1};
and.b32 xe, {$r0}, 0x0F0F0F0F;
shl.b32 a, xe, 1;
shl.b32 b, xe, 4;
lop3.b32 t, a, b, 0x8E008E00, 0xA8;
mul.rn.f16x2 {$w2}, t, {$r1};
lop3.b32 t, a, b, 0x008E008E, 0xA8;
shl.b32 t, t, 8;
mul.rn.f16x2 {$w3}, t, {$r1};
}"""
REBIAS_ORDER = (3, 7, 1, 5, 2, 6, 0, 4)  # nibble of each output half, low half first
REBIAS_LOG2 = 14  # each decoded operand is its value times 2^-14


def decode_e2m1x8_rebias(word: Uint32, scale_x2: Uint32):
    """8 packed E2M1 codes -> 4 f16x2 words (halves in ``REBIAS_ORDER``), each the code's value
    times the f16x2 ``scale_x2`` times 2^-14, exactly (``DECODE8_REBIAS``)."""
    return inline_ptx(DECODE8_REBIAS, write_only_types=[Uint32] * 4, read_only_args=[word, scale_x2])


# The former decode (prmt table lookup, 17 instructions), kept as the reference of the tests.
DECODE8_PAIRS = """{
.reg .b32 y, yh, m0, m1, a, s0, s1, t;
and.b32 y, {$r0}, 0x77777777;
shr.u32 yh, y, 16;
prmt.b32 m0, %LO%, %HI%, y;
prmt.b32 m1, %LO%, %HI%, yh;
shl.b32 a, {$r0}, 4;
prmt.b32 s0, a, {$r0}, 0x5140;
prmt.b32 s1, a, {$r0}, 0x7362;
lop3.b32 m0, s0, m0, 0x80808080, 0xEC;
lop3.b32 m1, s1, m1, 0x80808080, 0xEC;
prmt.b32 t, m0, 0, 0x1404;
mul.rn.f16x2 {$w0}, t, {$r1};
prmt.b32 t, m0, 0, 0x3424;
mul.rn.f16x2 {$w1}, t, {$r1};
prmt.b32 t, m1, 0, 0x1404;
mul.rn.f16x2 {$w2}, t, {$r1};
prmt.b32 t, m1, 0, 0x3424;
mul.rn.f16x2 {$w3}, t, {$r1};
}""".replace("%LO%", hex(E2M1_F16_HI_LO)).replace("%HI%", hex(E2M1_F16_HI_HI))
# lop3 immLut 0xEC = (a & c) | b  (a=0xF0, b=0xCC, c=0xAA).


def decode_e2m1x8_pairs(word: Uint32, scale_x2: Uint32):
    """8 packed E2M1 codes -> 4 f16x2 words in the order (n0,n1 | n2,n3 | n4,n5 | n6,n7), each
    times the f16x2 ``scale_x2``; the values of ``ptx.decode_e2m1x8`` (exact)."""
    return inline_ptx(DECODE8_PAIRS, write_only_types=[Uint32] * 4, read_only_args=[word, scale_x2])


def ld_shared_v4_at(addr: Int32, off: int):
    """128-bit shared load from ``addr + off`` (``off`` a compile-time byte offset)."""
    return inline_ptx(f"ld.shared.v4.b32 {{{{$w0}}, {{$w1}}, {{$w2}}, {{$w3}}}}, [{{$r0}}+{int(off)}];",
                      write_only_types=[Uint32] * 4, read_only_args=[addr])


def ld_shared_u32_at(addr: Int32, off: int) -> Uint32:
    return inline_ptx(f"ld.shared.b32 {{$w0}}, [{{$r0}}+{int(off)}];", write_only_types=[Uint32],
                      read_only_args=[addr])


def st_shared_f32_scaled(addr: Int32, v: Uint32, scale_bits: int) -> None:
    """Store the FP32 ``v`` (bit pattern) times the FP32 constant with bits ``scale_bits`` (a power
    of two: exact) to shared ``addr``."""
    inline_ptx(f"""{{
.reg .f32 t;
mul.rn.f32 t, {{$r1}}, 0f{scale_bits:08X};
st.shared.f32 [{{$r0}}], t;
}}""", read_only_args=[addr, v])


# Four E4M3 block scales -> four broadcast f16x2 words. The broadcasts are half moves, which ptxas
# folds into the operand selects of the decode's HMUL2 (.H0_H0 / .H1_H1): no PRMT left in SASS
# (ptx.e4m3x4_to_f16x2_bcast's prmt broadcasts stay as 4 PRMT per 4 scales).
SCALES4_MOV = """{
.reg .b16 lo, hi, a0, a1, b0, b1;
.reg .b32 a, b;
mov.b32 {lo, hi}, {$r0};
cvt.rn.f16x2.e4m3x2 a, lo;
cvt.rn.f16x2.e4m3x2 b, hi;
mov.b32 {a0, a1}, a;
mov.b32 {b0, b1}, b;
mov.b32 {$w0}, {a0, a0};
mov.b32 {$w1}, {a1, a1};
mov.b32 {$w2}, {b0, b0};
mov.b32 {$w3}, {b1, b1};
}"""


def e4m3x4_to_f16x2_bcast_mov(scales: Uint32):
    """Four E4M3 bytes (byte i = scale i) -> four f16x2 words, word i = (scale i, scale i), exact."""
    return inline_ptx(SCALES4_MOV, write_only_types=[Uint32] * 4, read_only_args=[scales])


def e4m3x2_to_f16x2_bcast(scales: Uint32):
    """The two low E4M3 bytes -> two f16x2 words, word i = (scale i, scale i) (exact conversion)."""
    return inline_ptx("""{
.reg .b16 lo, hi;
.reg .b32 a;
mov.b32 {lo, hi}, {$r0};
cvt.rn.f16x2.e4m3x2 a, lo;
prmt.b32 {$w0}, a, a, 0x1010;
prmt.b32 {$w1}, a, a, 0x3232;
}""", write_only_types=[Uint32] * 2, read_only_args=[scales])


def mma_16816(a0: Uint32, a1: Uint32, a2: Uint32, a3: Uint32, b0: Uint32, b1: Uint32,
              c0: Uint32, c1: Uint32, c2: Uint32, c3: Uint32):
    """D = A(16x16, f16, row) * B(16x8, f16, col) + C, FP32 accumulation; returns d0..d3. The FP32
    accumulators travel as their bit patterns (``.b32`` registers are valid ``.f32`` operands), which
    keeps the DSL from inserting a register move per FP32 input."""
    return inline_ptx(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, "
        "{{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};",
        write_only_types=[Uint32] * 4, read_only_args=[a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])
