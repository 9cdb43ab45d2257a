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


def st_shared_f32(addr: Int32, v: Float32) -> None:
    inline_ptx("st.shared.f32 [{$r0}], {$r1};", read_only_args=[addr, v])


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
              c0: Float32, c1: Float32, c2: Float32, c3: Float32):
    """D = A(16x16, f16, row) * B(16x8, f16, col) + C, FP32 accumulation; returns d0..d3."""
    return inline_ptx(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, "
        "{{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};",
        write_only_types=[Float32] * 4, read_only_args=[a0, a1, a2, a3, b0, b1, c0, c1, c2, c3])
