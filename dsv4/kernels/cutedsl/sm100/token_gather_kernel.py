"""The token gather before the sm_100a grouped decode GEMM (``grouped_decode_kernel.py``): one CTA per
token-tile slot implements ``token_tiles.slot_schedule`` + ``token_tiles.gather_token_tiles`` in one
launch (a chain of torch ops would cost a dozen small launches per GEMM).

CTA ``s`` (128 threads): the block-wide scan of the per-expert tile counts over ``offsets`` (the sm_90a
grouped kernels' ``grouped_schedule``, arch-neutral SIMT) gives ``(expert, row_lo, row_hi)``; thread 0
writes it as ``sched[s]``; the threads copy the slot's packed token rows in 16-byte words (zeros past
``row_hi``) and write every 4-byte word of the slot's 128-row scale atom: the 4 scales of row ``r`` and
4-column group ``kt`` taken from token ``row_lo + r`` (``scale_offsets.swizzled_scale_offset``: four
scale columns of a row are one aligned word in the 32_4_4 layout), zero for rows past the slot's
tokens. Every output byte is written, so the buffers need no memset.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint32
from cutlass.cute.arch import inline_ptx

from ..scale_offsets import swizzled_scale_offset
from ..sm90.grouped_schedule import grouped_schedule
from .layout import SF_TILE_ROWS

THREADS = 128
ATOM_BYTES = 512  # one 32_4_4 atom: 128 rows x 4 scale columns


def _ld_v4(addr: Int64):
    return inline_ptx("ld.global.nc.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                      write_only_types=[Uint32] * 4, read_only_args=[addr])


def _st_v4(addr: Int64, w0: Uint32, w1: Uint32, w2: Uint32, w3: Uint32) -> None:
    inline_ptx("st.global.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, w0, w1, w2, w3])


def _ld_b32(addr: Int64) -> Uint32:
    return inline_ptx("ld.global.nc.b32 {$w0}, [{$r0}];", write_only_types=[Uint32], read_only_args=[addr])


def _st_b32(addr: Int64, w: Uint32) -> None:
    inline_ptx("st.global.b32 [{$r0}], {$r1};", read_only_args=[addr, w])


class TokenGather:
    """Compile-time ``ntok`` (token rows per slot); ``__call__`` is the ``@cute.jit`` host entry."""

    def __init__(self, ntok: int):
        if ntok not in (8, 16):
            raise ValueError(f"token gather: ntok in (8, 16), found {ntok}")
        self.ntok = ntok

    @cute.jit
    def __call__(self, offsets: cute.Pointer, x: cute.Pointer, xsf: cute.Pointer, x_out: cute.Pointer,
                 xsf_out: cute.Pointer, sched: cute.Pointer, experts: Int32, k: Int32, slots: Int32, stream):
        """``offsets`` int32 [E+1]; ``x`` packed [rows, K/2] and ``xsf`` its flat 32_4_4 scales; out:
        ``x_out`` [slots * ntok, K/2], ``xsf_out`` [slots * 128 * round_up(K/16, 4)], ``sched`` [slots, 4]."""
        self.kernel(offsets, x, xsf, x_out, xsf_out, sched, experts, k).launch(
            grid=[slots, 1, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, offsets: cute.Pointer, x: cute.Pointer, xsf: cute.Pointer, x_out: cute.Pointer,
               xsf_out: cute.Pointer, sched: cute.Pointer, experts: Int32, k: Int32):
        tid, _, _ = cute.arch.thread_idx()
        slot, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        misc = smem.allocate_tensor(Int32, cute.make_layout(16), byte_alignment=16)
        grouped_schedule(offsets, experts, slot, tid, misc, self.ntok, THREADS, True)
        expert = misc[0]
        row_lo = misc[1]
        cnt = misc[2] - row_lo  # 0..ntok token rows in this slot
        if tid == 0:
            sched_t = cute.make_tensor(sched, cute.make_layout(4 * (slot + 1)))
            sched_t[4 * slot] = expert
            sched_t[4 * slot + 1] = row_lo
            sched_t[4 * slot + 2] = misc[2]
            sched_t[4 * slot + 3] = Int32(0)

        # packed token rows, 16 bytes at a time (K % 32 == 0: rows are whole 16-byte words)
        row_bytes = k // 2
        words = row_bytes // 16
        x_base = x.toint()
        out_base = x_out.toint() + Int64(slot * self.ntok) * Int64(row_bytes)
        for w in cutlass.range(tid, self.ntok * words, THREADS, unroll=1):
            i = w // words
            q = w % words
            v0, v1, v2, v3 = Uint32(0), Uint32(0), Uint32(0), Uint32(0)
            if i < cnt:
                v0, v1, v2, v3 = _ld_v4(x_base + Int64(row_lo + i) * Int64(row_bytes) + Int64(q * 16))
            _st_v4(out_base + Int64(i) * Int64(row_bytes) + Int64(q * 16), v0, v1, v2, v3)

        # the slot's scale atom, one 4-byte word (4 scale columns of one row) at a time
        sc_pad = (k // 16 + 3) // 4 * 4
        sf_words = SF_TILE_ROWS * sc_pad // 4
        sf_base = xsf.toint()
        sf_out = xsf_out.toint() + Int64(slot) * Int64(SF_TILE_ROWS * sc_pad)
        for w in cutlass.range(tid, sf_words, THREADS, unroll=1):
            o = w * 4
            kt = o // ATOM_BYTES
            r = (o % ATOM_BYTES) // 16 + ((o % 16) // 4) * 32  # row 32*r1 + r0 of the atom
            v = Uint32(0)
            if r < cnt:
                v = _ld_b32(sf_base + Int64(swizzled_scale_offset(row_lo + r, kt * 4, sc_pad)))
            _st_b32(sf_out + Int64(o), v)
