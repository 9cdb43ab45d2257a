"""The grouped (MoE) GEMMs' tile schedule on the device, shared by gemm_kernel.py and
decode_gemm_kernel.py: CTA ``slot`` -> (expert, first token row, end row) by a block-wide scan of the
per-expert token-tile counts."""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def grouped_schedule(offsets: cute.Pointer, num_experts: Int32, slot: Int32, tid: Int32, sched_t: cute.Tensor,
                     tt: cutlass.Constexpr, nthr: cutlass.Constexpr, clamp_end: cutlass.Constexpr):
    """Writes [expert, start, end] to ``sched_t[0:3]`` (start == end: no work); ``sched_t[8:8+warps]``
    holds the per-warp totals. ``tt`` token rows per tile, ``nthr`` threads in the CTA; the end row is
    the expert's last (``clamp_end`` False) or the tile's (True)."""
    nwarps = nthr // 32
    off = cute.make_tensor(offsets, cute.make_layout(num_experts + 1))
    per = (num_experts + nthr - 1) // nthr
    e0 = tid * per
    local = Int32(0)
    for j in cutlass.range(per, unroll=1):
        e = e0 + j
        if e < num_experts:
            local = local + (off[e + 1] - off[e] + tt - 1) // tt
    lane = tid % 32
    warp = tid // 32
    incl = local
    for sh in cutlass.range_constexpr(5):
        d = 1 << sh
        v = cute.arch.shuffle_sync_up(incl, d)
        if lane >= d:
            incl = incl + v
    if tid == 0:
        sched_t[0] = Int32(0)
        sched_t[1] = Int32(0)
        sched_t[2] = Int32(0)
    if lane == 31:
        sched_t[8 + warp] = incl
    cute.arch.sync_threads()
    before = Int32(0)
    for w in cutlass.range_constexpr(nwarps):
        if w < warp:
            before = before + sched_t[8 + w]
    excl = before + incl - local
    if slot >= excl and slot < excl + local:
        base = excl
        for j in cutlass.range(per, unroll=1):
            e = e0 + j
            if e < num_experts:
                lo = off[e]
                hi = off[e + 1]
                cnt = (hi - lo + tt - 1) // tt
                if slot >= base and slot < base + cnt:
                    sched_t[0] = e
                    sched_t[1] = lo + (slot - base) * tt
                    if cutlass.const_expr(clamp_end):
                        sched_t[2] = cutlass.min(hi, lo + (slot - base + 1) * tt)
                    else:
                        sched_t[2] = hi
                base = base + cnt
    cute.arch.sync_threads()
