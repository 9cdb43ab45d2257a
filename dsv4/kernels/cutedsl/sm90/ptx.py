"""Inline-PTX device helpers for the sm_90a NVFP4 kernels (Hopper has no FP4 conversions).

E2M1 -> FP16 decode: a ``prmt`` byte lookup of the FP16 high bytes of {0, .5, 1, 1.5, 2, 3, 4, 6}
(their low bytes are all zero), a second ``prmt`` that interleaves those bytes into f16x2 words
(selector nibble 8 = "replicate the sign of a byte whose msb is 0" = a zero byte), then the sign
bit OR-ed in with one shift. Spec §2.2. The eight FP16 values of a word come out in the order
(n0, n4, n1, n5, n2, n6, n3, n7): both GEMM operands are decoded by this same function, so the
dot product over each 8-element group is unchanged (only the FP32 summation order inside the MMA
differs, which the contract allows).

The block scale is applied with ``mul.rn.f16x2``: e2m1 * e4m3 has <= 6 significant bits and lies in
[2^-10, 2688], so the product is exact in FP16 (spec §6). ``cvt.rn.f16x2.e4m3x2`` is exact too.
"""
from __future__ import annotations

from cutlass import Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

# FP16 high bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5 | 2, 3, 4, 6.
E2M1_F16_HI_LO = 0x3E3C3800
E2M1_F16_HI_HI = 0x46444240

_DECODE8 = """{
.reg .b32 y, yh, m0, m1, t, u;
and.b32 y, {$r0}, 0x77777777;
shr.u32 yh, y, 16;
prmt.b32 m0, %LO%, %HI%, y;
prmt.b32 m1, %LO%, %HI%, yh;
prmt.b32 t, m0, m1, 0x4808;
shl.b32 u, {$r0}, 12;
lop3.b32 t, t, u, 0x80008000, 0xF8;
mul.rn.f16x2 {$w0}, t, {$r1};
prmt.b32 t, m0, m1, 0x5818;
shl.b32 u, {$r0}, 8;
lop3.b32 t, t, u, 0x80008000, 0xF8;
mul.rn.f16x2 {$w1}, t, {$r1};
prmt.b32 t, m0, m1, 0x6828;
shl.b32 u, {$r0}, 4;
lop3.b32 t, t, u, 0x80008000, 0xF8;
mul.rn.f16x2 {$w2}, t, {$r1};
prmt.b32 t, m0, m1, 0x7838;
lop3.b32 t, t, {$r0}, 0x80008000, 0xF8;
mul.rn.f16x2 {$w3}, t, {$r1};
}""".replace("%LO%", hex(E2M1_F16_HI_LO)).replace("%HI%", hex(E2M1_F16_HI_HI))
# lop3 immLut 0xF8 = a | (b & c)  (a=0xF0, b=0xCC, c=0xAA).


def decode_e2m1x8(word: Uint32, scale_x2: Uint32):
    """8 packed E2M1 codes -> 4 f16x2 words (order n0,n4 | n1,n5 | n2,n6 | n3,n7), each times the
    f16x2 ``scale_x2`` (the block scale in both halves)."""
    return inline_ptx(_DECODE8, write_only_types=[Uint32] * 4, read_only_args=[word, scale_x2])


_SCALES4 = """{
.reg .b16 lo, hi;
.reg .b32 a, b;
mov.b32 {lo, hi}, {$r0};
cvt.rn.f16x2.e4m3x2 a, lo;
cvt.rn.f16x2.e4m3x2 b, hi;
prmt.b32 {$w0}, a, a, 0x1010;
prmt.b32 {$w1}, a, a, 0x3232;
prmt.b32 {$w2}, b, b, 0x1010;
prmt.b32 {$w3}, b, b, 0x3232;
}"""


def e4m3x4_to_f16x2_bcast(scales: Uint32):
    """Four E4M3 bytes (byte i = scale i) -> four f16x2 words, word i = (scale i, scale i)."""
    return inline_ptx(_SCALES4, write_only_types=[Uint32] * 4, read_only_args=[scales])


def cp_async_16(smem_addr: Int32, gmem_addr: Int64, src_bytes: Int32) -> None:
    """16-byte global->shared async copy; bytes past ``src_bytes`` (0..16) are zero-filled. The
    256-byte L2 prefetch hint pulls the row's next k-tiles (contiguous along K) into L2 early."""
    inline_ptx("cp.async.cg.shared.global.L2::256B [{$r0}], [{$r1}], 16, {$r2};",
               read_only_args=[smem_addr, gmem_addr, src_bytes])


def cp_async_8(smem_addr: Int32, gmem_addr: Int64, src_bytes: Int32) -> None:
    inline_ptx("cp.async.ca.shared.global [{$r0}], [{$r1}], 8, {$r2};",
               read_only_args=[smem_addr, gmem_addr, src_bytes])


def cp_async_4(smem_addr: Int32, gmem_addr: Int64, src_bytes: Int32) -> None:
    inline_ptx("cp.async.ca.shared.global [{$r0}], [{$r1}], 4, {$r2};",
               read_only_args=[smem_addr, gmem_addr, src_bytes])


def ld_shared_v4(addr: Int32):
    return inline_ptx("ld.shared.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                      write_only_types=[Uint32] * 4, read_only_args=[addr])


def ld_shared_u32(addr: Int32) -> Uint32:
    return inline_ptx("ld.shared.b32 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def st_shared_v4(addr: Int32, w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32) -> None:
    inline_ptx("st.shared.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};",
               read_only_args=[addr, w0, w1, w2, w3])
