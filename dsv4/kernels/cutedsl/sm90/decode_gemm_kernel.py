"""sm_90a NVFP4 GEMM specialized for decode (M <= 16 tokens): warp-specialized weight streaming.

``y[M, N] = alpha * a[M, K] @ b[N, K]^T`` with a = the few tokens, b = the weights; ``grouped``: the
MoE form (expert e's rows ``offsets[e]:offsets[e+1]`` of a times expert e's weights, alpha[e]),
token tiles per expert scheduled on the device (grid.z slots, as gemm_kernel.py).

CTA = one producer warp + ``consumer_warps`` (4 or 8) consumer warps; it owns ``rows`` (64, 128 or
256) weight rows (``swiglu``: rows/2 gate rows + the matching rows/2 up rows) x all M tokens x a K
range (split-K over ``gridDim.y``). Per k-tile (``bk`` = 128 or 256 elements of K):

* producer warp: waits for the ring stage to be empty (mbarrier), then lane 0 arms the stage's
  *full* mbarrier with the byte count, and the lanes issue one 1-D bulk async copy
  (``cp.async.bulk``, TMA engine, L2 evict-first) per weight row and per token row
  (``bk/2`` packed bytes each), plus 4-byte ``cp.async`` copies of the swizzled E4M3 scales
  (one per row and 64 K; zero-filled past K, so codes past K meet a zero scale) whose completion
  is tracked by the same mbarrier (``cp.async.mbarrier.arrive.noinc``). ``stages`` stages in flight.
* consumer warps: warp (phase p, row group h) handles k-tiles i = p (mod P), rows ``64h .. 64h+63``
  (P = consumer_warps / (rows / 64)). It decodes FP4 straight from shared memory into
  ``mma.sync.m16n8k16`` register fragments (weights = A, 4 m16 fragments; tokens = B, 1 or 2 n8
  fragments) by exponent rebias (``decode_ptx.DECODE8_REBIAS``: 11 integer instructions + 4 exact
  ``mul.rn.f16x2`` by the block scale per 8 codes): each operand is the WGMMA kernel's E2M1 x E4M3
  FP16 value times 2^-14, exactly (FP16 subnormals included). FP32 accumulation (every product and
  sum that of unscaled operands times 2^-28, all >= 2^-48: rounding commutes with the power of two),
  scaled back by 2^28 (exact) as they leave the registers; then it arrives on the *empty* mbarrier.

No FP16 tile in shared memory, no CTA barrier in the main loop. K order inside an MMA is a
permutation of the true K order, identical for both operands (each lane decodes the same K words
of its weight rows and of its token), so the dot products are unchanged.

Epilogue: the P phase partials are summed in shared memory in phase order, split-K partials through
an FP32 workspace in split order by the last CTA of the tile (atomic counter, self-resetting):
deterministic. Then alpha (FP32), optional SwiGLU ``silu(min(g,L)) * clamp(u,-L,L)``, BF16 stores.

Requires K % 32 == 0 (16-byte aligned rows and bulk copies), 16-byte aligned packed pointers and
swizzled (32_4_4) scales; rows past N and tokens past M are never copied (their stale smem only
reaches output rows / columns that are not stored); blocks past K get a zero scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Boolean, Float32, Int32, Int64, Uint32

from . import decode_ptx as dp
from . import ptx
from .grouped_schedule import grouped_schedule

FULL_ARRIVALS = 1 + 32  # lane 0's arrive.expect_tx + 32 cp.async arrivals
# Both MMA operands are decoded times 2^-14 (``decode_ptx.DECODE8_REBIAS``), so the accumulators
# hold the dot products times 2^-28, exactly: FP32 bits of 2^28, applied when they leave registers.
UNSCALE_BITS = (127 + 2 * dp.REBIAS_LOG2) << 23
COPY16_UNROLL = 4  # copy16: row chunks issued per unrolled producer iteration


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time shape class of the decode kernel (M, N, K, splits are runtime)."""

    ntok: int = 8  # token tile: 8 (M <= 8) or 16 (M <= 16)
    bk: int = 256  # K per stage: 128 or 256
    stages: int = 4
    consumer_warps: int = 4  # 4 or 8
    swiglu: bool = False
    rows: int = 128  # weight rows per CTA: 64, 128 or 256 (64 consumer-warp rows per row group)
    grouped: bool = False  # MoE: token tiles of each expert scheduled from the offsets (grid.z)
    # weight rows copied by the producer warp's lanes in coalesced 16-byte cp.async chunks (a row's
    # k-tile by bk/32 neighbouring lanes) instead of one 1-D bulk copy per row: a variant for the
    # question whether ~128-byte TMA requests limit the weight stream
    copy16: bool = False
    # the last split CTA's sum with every element's load of one split in flight at once (splits
    # outer, elements inner) instead of one L2 round trip per element and split; same order, same bits
    reduce_ilp: bool = False

    @property
    def row_groups(self) -> int:
        return self.rows // 64

    @property
    def nt(self) -> int:
        return self.ntok // 8

    @property
    def phases(self) -> int:
        return self.consumer_warps // self.row_groups

    @property
    def threads(self) -> int:
        return 32 * (self.consumer_warps + 1)

    @property
    def qpt(self) -> int:
        """16-byte quads (32 K) per lane per row and stage."""
        return self.bk // 128

    @property
    def groups(self) -> int:
        """64-K scale units per row and stage."""
        return self.bk // 64

    @property
    def pitch(self) -> int:
        """Shared row pitch (bytes): 144 for bk=256 (rows 4 banks apart), 64 for bk=128."""
        return self.bk // 2 + (16 if self.bk == 256 else 0)

    @property
    def a_off(self) -> int:
        return self.rows * self.pitch

    @property
    def ws_off(self) -> int:
        return self.a_off + self.ntok * self.pitch

    @property
    def as_off(self) -> int:
        return self.ws_off + self.rows * self.groups * 4

    @property
    def stage_bytes(self) -> int:
        return (self.as_off + self.ntok * self.groups * 4 + 127) // 128 * 128

    @property
    def ld(self) -> int:
        """Row pitch (floats) of the FP32 epilogue tile [row][token]."""
        return self.ntok + 1

    @property
    def col_tile(self) -> int:
        return self.rows // 2 if self.swiglu else self.rows

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + 128 + 2 * self.stages * 8 + 48 * 4 + 64

    def check(self) -> None:
        assert self.ntok in (8, 16), self.ntok
        assert self.bk in (128, 256), self.bk
        assert self.consumer_warps in (4, 8), self.consumer_warps
        assert self.rows in (64, 128, 256), self.rows
        assert self.consumer_warps % self.row_groups == 0, "every row group needs its warps"
        assert self.stages >= 2
        assert self.phases * self.rows * self.ld * 4 <= self.stages * self.stage_bytes, "epilogue tile"
        assert self.smem_bytes() <= 227 * 1024, self.smem_bytes()


class Sm90DecodeGemm:
    """Build with a ``DecodeConfig``; ``__call__`` is the ``@cute.jit`` launcher to ``cute.compile``."""

    def __init__(self, cfg: DecodeConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        a_words: cute.Pointer,  # Uint8: tokens, packed [M, K/2] (16-byte aligned)
        a_scales: cute.Pointer,  # Uint8: swizzled scales of a
        b_words: cute.Pointer,  # Uint8: weights, packed [E*N, K/2] (16-byte aligned)
        b_scales: cute.Pointer,  # Uint8: swizzled scales of b (per expert when grouped)
        alpha_a: cute.Pointer,  # Float32: a.global_scale (dense) / unused
        alpha_b: cute.Pointer,  # Float32: b.global_scale (dense) / alphas [E] (grouped)
        offsets: cute.Pointer,  # Int32 [E+1] (grouped) / unused
        out: cute.Pointer,  # BFloat16 [M, n_out]
        workspace: cute.Pointer,  # Float32 split-K partials [slots, tiles, splits, rows, ntok] / unused
        counters: cute.Pointer,  # Int32 [slots * tiles] split-K counters (zero, self-resetting) / unused
        m: Int32,
        n: Int32,  # weight rows (per expert)
        k: Int32,
        num_experts: Int32,
        tiles: Int32,  # weight-row tiles (grid.x)
        splits: Int32,  # grid.y
        slots: Int32,  # grid.z: token-tile slots (grouped) / 1
        swiglu_limit: Float32,
        stream,
    ):
        cfg = self.cfg

        @cute.struct
        class Storage:
            bars: cute.struct.MemRange[Int64, 2 * cfg.stages]
            misc: cute.struct.MemRange[Int32, 48]
            ring: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, cfg.stages * cfg.stage_bytes], 128]

        self.kernel(a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, offsets, out, workspace,
                    counters, m, n, k, num_experts, splits, swiglu_limit, Storage).launch(
            grid=[tiles, splits, slots], block=[cfg.threads, 1, 1], smem=Storage.size_in_bytes(),
            stream=stream)

    # ------------------------------------------------------------------ device kernel
    @cute.kernel
    def kernel(self, a_words: cute.Pointer, a_scales: cute.Pointer, b_words: cute.Pointer,
               b_scales: cute.Pointer, alpha_a: cute.Pointer, alpha_b: cute.Pointer, offsets: cute.Pointer,
               out: cute.Pointer, workspace: cute.Pointer, counters: cute.Pointer, m: Int32, n: Int32,
               k: Int32, num_experts: Int32, splits: Int32, swiglu_limit: Float32,
               Storage: cutlass.Constexpr):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        bx, bz, slot = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Storage)
        misc = cute.make_tensor(st.misc.data_ptr(), cute.make_layout(48))
        expert = Int32(0)
        tok0 = Int32(0)
        tok1 = m
        if cutlass.const_expr(cfg.grouped):
            grouped_schedule(offsets, num_experts, slot, tid, misc, cfg.ntok, cfg.threads, True)
            expert = misc[0]
            tok0 = misc[1]
            tok1 = misc[2]
        if tok0 < tok1:  # uniform per CTA
            self._tile(a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, out, workspace, counters,
                       m, n, k, splits, swiglu_limit, st, misc, tid, bx, bz, slot, expert, tok0, tok1)


    # ------------------------------------------------------------------ one (token tile, row tile, split)
    @cute.jit
    def _tile(self, a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, out, workspace, counters,
              m, n, k, splits, swiglu_limit, st, misc, tid, bx, bz, slot, expert, tok0, tok1):
        cfg = self.cfg
        S = cfg.stages
        warp = tid // 32
        lane = tid % 32
        bar0 = st.bars.data_ptr().toint()  # full[s] = bar0 + 8s, empty[s] = bar0 + 8(S+s)
        ring_ptr = st.ring.data_ptr()
        ring = ring_ptr.toint()

        k_tiles = (k + cfg.bk - 1) // cfg.bk
        per_split = (k_tiles + splits - 1) // splits
        kt0 = bz * per_split
        n_kt = cutlass.max(cutlass.min(k_tiles, kt0 + per_split) - kt0, 0)

        if tid == 0:
            for s in cutlass.range_constexpr(S):
                dp.mbar_init(bar0 + 8 * s, Int32(FULL_ARRIVALS))
                dp.mbar_init(bar0 + 8 * (S + s), Int32(32 * cfg.row_groups))
            dp.fence_mbar_init()
        cute.arch.sync_threads()

        acc = cute.make_rmem_tensor((4 * cfg.nt * 4,), Uint32)  # FP32 bit patterns
        acc.fill(0)
        if warp == cfg.consumer_warps:
            self._produce(a_words, a_scales, b_words, b_scales, n, k, kt0, n_kt, bx, lane, bar0, ring,
                          expert, tok0, tok1)
        else:
            self._consume(acc, k, kt0, n_kt, warp, lane, bar0, ring)
        cute.arch.sync_threads()  # every stage consumed: the ring is free for the epilogue

        # ---------------- phase partials -> FP32 tile [row][token] (phase order)
        ld = cfg.ld
        tile_f32 = cute.recast_ptr(ring_ptr, dtype=Float32)
        slab = cute.make_tensor(tile_f32, cute.make_layout(cfg.phases * cfg.rows * ld))
        if warp < cfg.consumer_warps:
            ph = warp // cfg.row_groups
            rh = warp % cfg.row_groups
            g = lane // 4
            t = lane % 4
            for f in cutlass.range_constexpr(4):
                for j in cutlass.range_constexpr(cfg.nt):
                    for c in cutlass.range_constexpr(4):
                        row = rh * 64 + f * 16 + g + 8 * (c // 2)
                        col = j * 8 + 2 * t + c % 2
                        dp.st_shared_f32_scaled(ring + ((ph * cfg.rows + row) * ld + col) * 4,
                                                acc[(f * cfg.nt + j) * 4 + c], UNSCALE_BITS)
        cute.arch.sync_threads()
        T = cfg.threads
        tile_elems = cfg.rows * cfg.ntok
        if cutlass.const_expr(cfg.phases > 1):
            for i in cutlass.range_constexpr((tile_elems + T - 1) // T):
                e = tid + i * T
                if e < tile_elems:
                    o = (e // cfg.ntok) * ld + e % cfg.ntok
                    v = slab[o]
                    for p in cutlass.range_constexpr(1, cfg.phases):
                        v = v + slab[p * cfg.rows * ld + o]
                    slab[o] = v
            cute.arch.sync_threads()

        last = Boolean(True)
        if splits > 1:
            gx, _, _ = cute.arch.grid_dim()
            last = self._split_reduce(slab, workspace, counters, splits, misc, tid, slot * gx + bx, bz)
        if last:
            self._store(slab, alpha_a, alpha_b, out, m, n, bx, swiglu_limit, tid, expert, tok0, tok1)

    # ------------------------------------------------------------------ producer warp
    @cute.jit
    def _wrow(self, r, bx, n):
        """Local weight row ``r`` of tile ``bx`` -> (global row, valid)."""
        cfg = self.cfg
        grow = Int32(0)
        valid = Boolean(False)
        if cutlass.const_expr(cfg.swiglu):
            nh = n // 2
            j = bx * (cfg.rows // 2) + r % (cfg.rows // 2)
            valid = j < nh
            grow = j
            if r >= cfg.rows // 2:
                grow = j + nh
        else:
            grow = bx * cfg.rows + r
            valid = grow < n
        return grow, valid

    @cute.jit
    def _scale_row_addr(self, sc_base, grow, sc_pad):
        """Address of row ``grow``'s scale word for 64-K unit 0 in the 32_4_4 layout (unit u: +512 u)."""
        return sc_base + Int64(((grow // 128) * (sc_pad // 4)) * 512 + (grow % 32) * 16 + ((grow // 32) % 4) * 4)

    @cute.jit
    def _copy_row(self, dst, ws_dst, src, sc_row, uoff, sbytes, kb, bar, policy, use_hint: cutlass.Constexpr):
        """Bulk copy of one row's k-tile (``kb`` bytes from ``src``) + its 64-K scale words
        (4-byte cp.async of ``sbytes[u]`` bytes from ``sc_row + uoff[u]``, the rest zero-filled)."""
        if cutlass.const_expr(use_hint):
            dp.bulk_g2s_hint(dst, src, kb, bar, policy)
        else:
            dp.bulk_g2s(dst, src, kb, bar)
        self._copy_scales(ws_dst, sc_row, uoff, sbytes)

    @cute.jit
    def _copy_scales(self, ws_dst, sc_row, uoff, sbytes):
        """One row's 64-K scale words of the k-tile: 4-byte cp.async (``sbytes[u]`` valid, rest zero)."""
        for u in cutlass.range_constexpr(self.cfg.groups):
            ptx.cp_async_4(ws_dst + u * 4, sc_row + uoff[u], sbytes[u])

    @cute.jit
    def _produce(self, a_words, a_scales, b_words, b_scales, n, k, kt0, n_kt, bx, lane, bar0, ring,
                 expert, tok0, tok1):
        cfg = self.cfg
        S = cfg.stages
        row_bytes = Int64(k // 2)
        n_pad = (n + 127) // 128 * 128
        scale_cols = k // 16
        sc_pad = (scale_cols + 3) // 4 * 4
        a_base = a_words.toint()
        b_base = b_words.toint() + Int64(expert) * Int64(n) * row_bytes
        as_base = a_scales.toint()
        bs_base = b_scales.toint() + Int64(expert) * Int64(n_pad) * Int64(sc_pad)
        policy = dp.l2_evict_first()
        vrows = Int32(0)
        if cutlass.const_expr(cfg.swiglu):
            vrows = 2 * cutlass.max(cutlass.min(n // 2 - bx * (cfg.rows // 2), cfg.rows // 2), 0)
        else:
            vrows = cutlass.max(cutlass.min(n - bx * cfg.rows, cfg.rows), 0)
        vtok = cutlass.min(tok1 - tok0, cfg.ntok)
        # this lane's rows (lane + 32 j) and token (tok0 + lane): addresses hoisted out of the loop
        row_valid = []
        row_src = []
        row_sc = []
        for j in cutlass.range_constexpr(cfg.rows // 32):
            grow, valid = self._wrow(lane + 32 * j, bx, n)
            row_valid.append(valid)
            row_src.append(b_base + Int64(grow) * row_bytes)
            row_sc.append(self._scale_row_addr(bs_base, grow, sc_pad))
        tok = tok0 + lane
        tok_src = a_base + Int64(tok) * row_bytes
        tok_sc = self._scale_row_addr(as_base, tok, sc_pad)
        for i in cutlass.range(n_kt, unroll=1):
            s = i % S
            full = bar0 + 8 * s
            if i >= S:
                dp.mbar_wait(bar0 + 8 * (S + s), (i // S - 1) % 2)
            kt = kt0 + i
            k_el = kt * cfg.bk
            kb = cutlass.min(cfg.bk // 2, (k - k_el) // 2)
            if lane == 0:
                if cutlass.const_expr(cfg.copy16):
                    dp.mbar_arrive_expect_tx(full, vtok * kb)  # only the token rows go by bulk copy
                else:
                    dp.mbar_arrive_expect_tx(full, (vrows + vtok) * kb)
            cute.arch.sync_warp()
            base = ring + s * cfg.stage_bytes
            koff = Int64(k_el // 2)
            # per 64-K unit of this k-tile: valid scale bytes and the offset of its scale word from
            # the row's unit-0 word (0 for a unit past K: nothing is read, the word becomes 0)
            sbytes = []
            uoff = []
            for u in cutlass.range_constexpr(cfg.groups):
                cg = kt * cfg.groups + u
                sb = cutlass.max(cutlass.min(scale_cols - cg * 4, 4), 0)
                off = Int64(0)
                if sb > 0:
                    off = Int64(cg * 512)
                sbytes.append(sb)
                uoff.append(off)
            if cutlass.const_expr(cfg.copy16):
                self._copy_rows16(base, b_base, row_bytes, koff, kb, bx, n, lane)
            for j in cutlass.range_constexpr(cfg.rows // 32):
                r = lane + 32 * j
                if row_valid[j]:
                    ws_dst = base + cfg.ws_off + r * cfg.groups * 4
                    if cutlass.const_expr(cfg.copy16):  # the row's bytes went by _copy_rows16
                        self._copy_scales(ws_dst, row_sc[j], uoff, sbytes)
                    else:
                        self._copy_row(base + r * cfg.pitch, ws_dst, row_src[j] + koff, row_sc[j], uoff, sbytes,
                                       kb, full, policy, True)
            if lane < vtok:
                self._copy_row(base + cfg.a_off + lane * cfg.pitch, base + cfg.as_off + lane * cfg.groups * 4,
                               tok_src + koff, tok_sc, uoff, sbytes, kb, full, policy, False)
            dp.cp_async_mbar_arrive_noinc(full)

    @cute.jit
    def _copy_rows16(self, base, b_base, row_bytes, koff, kb, bx, n, lane):
        """``copy16``: the stage's weight rows in 16-byte ``cp.async`` chunks, ``bk/32`` lanes a row
        (one warp instruction covers 32 / (bk/32) whole row segments: coalesced). Chunks past K or
        rows past N are zero-filled without a read (source size 0, source address the row 0)."""
        cfg = self.cfg
        cpr = cfg.bk // 32
        rpi = 32 // cpr
        q = lane % cpr
        rsub = lane // cpr
        for it in cutlass.range(cfg.rows // rpi, unroll=COPY16_UNROLL):  # not fully: registers
            r = rsub + rpi * it
            grow, valid = self._wrow(r, bx, n)
            nb = Int32(0)
            src = b_base
            if valid and q * 16 < kb:
                nb = Int32(16)
                src = b_base + Int64(grow) * row_bytes + koff + Int64(q * 16)
            ptx.cp_async_16(base + r * cfg.pitch + q * 16, src, nb)

    # ------------------------------------------------------------------ consumer warps
    @cute.jit
    def _consume(self, acc, k, kt0, n_kt, warp, lane, bar0, ring):
        cfg = self.cfg
        S = cfg.stages
        ph = warp // cfg.row_groups
        rh = warp % cfg.row_groups
        g = lane // 4
        t = lane % 4
        # this lane's shared-memory offsets inside a stage (everything else is an immediate):
        # its first weight row / token row and its quad column, its first scale words
        if cutlass.const_expr(cfg.qpt == 2):
            qcol = t * 32  # quads 2t, 2t + 1: lane t owns the 64-K unit t
            unit = t
            shift = Uint32(0)
        else:
            qcol = t * 16  # quad t = half t % 2 of unit t // 2
            unit = t // 2
            shift = Uint32((t % 2) * 16)
        row_off = (rh * 64 + g) * cfg.pitch + qcol
        tok_off = cfg.a_off + g * cfg.pitch + qcol
        wsc_off = cfg.ws_off + ((rh * 64 + g) * cfg.groups + unit) * 4
        asc_off = cfg.as_off + (g * cfg.groups + unit) * 4
        for i in cutlass.range(ph, n_kt, cfg.phases, unroll=1):
            iu = Uint32(i)  # unsigned: stage and parity are a mask and a shift for 2^n stages
            s = iu % Uint32(S)
            dp.mbar_wait(bar0 + 8 * Int32(s), Int32((iu // Uint32(S)) % Uint32(2)))
            base = ring + Int32(s) * cfg.stage_bytes
            wrow = base + row_off
            trow = base + tok_off
            if cutlass.const_expr(cfg.qpt == 2):
                bs = self._scales(base + asc_off, base + wsc_off, shift, True)
                for qq in cutlass.range_constexpr(2):
                    self._quad(acc, wrow, trow, qq * 16, bs, 2 * qq)
            else:
                bs = self._scales(base + asc_off, base + wsc_off, shift, False)
                self._quad(acc, wrow, trow, 0, bs, 0)
            dp.mbar_arrive(bar0 + 8 * (S + Int32(s)))

    @cute.jit
    def _scales(self, asc, wsc, shift, four: cutlass.Constexpr):
        """Block scales of this lane's rows (nt tokens, then 8 weight rows) for its 64-K unit as
        f16x2 broadcast words: all four blocks (``four``) or the two at byte ``shift // 8``.
        ``asc`` / ``wsc``: shared address of the unit's scale word of its first token / weight row."""
        cfg = self.cfg
        G = cfg.groups
        words = []
        for j in cutlass.range_constexpr(cfg.nt):
            words.append(dp.ld_shared_u32_at(asc, 8 * j * G * 4))
        for f in cutlass.range_constexpr(4):
            for hh in cutlass.range_constexpr(2):
                words.append(dp.ld_shared_u32_at(wsc, (f * 16 + 8 * hh) * G * 4))
        out = []
        for w in words:
            if cutlass.const_expr(four):
                out.append(dp.e4m3x4_to_f16x2_bcast_mov(w))
            else:
                out.append(dp.e4m3x2_to_f16x2_bcast(w >> shift))
        return out

    @cute.jit
    def _quad(self, acc, wrow, trow, qoff: cutlass.Constexpr, scl, s0: cutlass.Constexpr):
        """One 32-K quad of every row of this warp and of every token: 8 k16-steps x 4 fragments.
        ``wrow`` / ``trow`` + ``qoff``: the quad of this lane's first weight / token row.
        ``scl[row]``: f16x2 scales of the row (tokens first); the quad's two blocks are
        ``scl[row][s0]`` and ``scl[row][s0 + 1]``. Operands are decoded times 2^-14 (rebias)."""
        cfg = self.cfg
        nt = cfg.nt
        P = cfg.pitch
        # tokens (B operand): rows g and g + 8
        bw = []
        for j in cutlass.range_constexpr(nt):
            bw.append(dp.ld_shared_v4_at(trow, 8 * j * P + qoff))
        # weights (A operand): rows rh*64 + 16f + g (+8)
        aw = []
        for f in cutlass.range_constexpr(4):
            for hh in cutlass.range_constexpr(2):
                aw.append(dp.ld_shared_v4_at(wrow, (f * 16 + 8 * hh) * P + qoff))
        for w in cutlass.range_constexpr(4):  # words of the quad; scale block w // 2
            hb = []
            for j in cutlass.range_constexpr(nt):
                hb.append(dp.decode_e2m1x8_rebias(bw[j][w], scl[j][s0 + w // 2]))
            for f in cutlass.range_constexpr(4):
                h0 = dp.decode_e2m1x8_rebias(aw[2 * f][w], scl[nt + 2 * f][s0 + w // 2])
                h1 = dp.decode_e2m1x8_rebias(aw[2 * f + 1][w], scl[nt + 2 * f + 1][s0 + w // 2])
                for j in cutlass.range_constexpr(nt):
                    for st in cutlass.range_constexpr(2):
                        a_ = (f * nt + j) * 4
                        d0, d1, d2, d3 = dp.mma_16816(
                            h0[2 * st], h1[2 * st], h0[2 * st + 1], h1[2 * st + 1],
                            hb[j][2 * st], hb[j][2 * st + 1],
                            acc[a_], acc[a_ + 1], acc[a_ + 2], acc[a_ + 3])
                        acc[a_] = d0
                        acc[a_ + 1] = d1
                        acc[a_ + 2] = d2
                        acc[a_ + 3] = d3

    # ------------------------------------------------------------------ epilogue
    @cute.jit
    def _split_reduce(self, slab, workspace, counters, splits, misc, tid, tile_id, bz):
        """Write this split's FP32 tile; the last split CTA of the tile (atomic counter, reset to 0
        for the next launch) sums all partials in split order into ``slab``."""
        cfg = self.cfg
        T = cfg.threads
        ld = cfg.ld
        tile_elems = cfg.rows * cfg.ntok
        base = (tile_id * splits + bz) * tile_elems
        for i in cutlass.range_constexpr((tile_elems + T - 1) // T):
            e = tid + i * T
            if e < tile_elems:
                cute.arch.store(workspace + (base + e), slab[(e // cfg.ntok) * ld + e % cfg.ntok])
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        if tid == 0:
            cnt_ptr = counters + tile_id
            old = cute.arch.atomic_add(cnt_ptr, Int32(1), sem="acq_rel", scope="gpu")
            is_last = Int32(0)
            if old == splits - 1:
                is_last = Int32(1)
                cute.arch.atomic_exch(cnt_ptr, Int32(0), sem="relaxed", scope="gpu")
            misc[4] = is_last
        cute.arch.sync_threads()
        last = misc[4] != 0
        if last:
            cute.arch.fence_acq_rel_gpu()
            if cutlass.const_expr(cfg.reduce_ilp):
                # splits outer, this thread's elements inner: every element's load of one split is
                # in flight at once; each element still sums 0 + split 0 + split 1 + ... in order
                n_el = (tile_elems + T - 1) // T
                tots = cute.make_rmem_tensor((n_el,), Float32)
                tots.fill(0.0)
                for zz in cutlass.range(splits, unroll=2):  # fixed split order
                    zbase = (tile_id * splits + zz) * tile_elems
                    for i in cutlass.range_constexpr(n_el):
                        e = cutlass.min(tid + i * T, tile_elems - 1)  # past the tile: a harmless re-read
                        tots[i] = tots[i] + cute.arch.load(workspace + (zbase + e), Float32, cop="cg")
                for i in cutlass.range_constexpr(n_el):
                    e = tid + i * T
                    if e < tile_elems:
                        slab[(e // cfg.ntok) * ld + e % cfg.ntok] = tots[i]
            else:
                for i in cutlass.range_constexpr((tile_elems + T - 1) // T):
                    e = tid + i * T
                    if e < tile_elems:
                        tot = Float32(0.0)
                        for zz in cutlass.range(splits, unroll=4):  # fixed split order
                            tot = tot + cute.arch.load(
                                workspace + ((tile_id * splits + zz) * tile_elems + e), Float32, cop="cg")
                        slab[(e // cfg.ntok) * ld + e % cfg.ntok] = tot
            cute.arch.sync_threads()
        return last

    @cute.jit
    def _store(self, slab, alpha_a, alpha_b, out, m, n, bx, swiglu_limit, tid, expert, tok0, tok1):
        """alpha (FP32) -> optional SwiGLU -> BF16, predicated on valid tokens and columns."""
        cfg = self.cfg
        ld = cfg.ld
        alpha = Float32(0.0)
        if cutlass.const_expr(cfg.grouped):
            alpha = cute.make_tensor(alpha_b, cute.make_layout(expert + 1))[expert]
        else:
            alpha = (cute.make_tensor(alpha_a, cute.make_layout(1))[0]
                     * cute.make_tensor(alpha_b, cute.make_layout(1))[0])
        n_out = n
        if cutlass.const_expr(cfg.swiglu):
            n_out = n // 2
        ct = cfg.col_tile
        col0 = bx * ct
        total = cfg.ntok * ct
        outt = cute.make_tensor(out, cute.make_layout((m, n_out), stride=(n_out, 1)))
        for i in cutlass.range_constexpr((total + cfg.threads - 1) // cfg.threads):
            e = tid + i * cfg.threads
            tl = e // ct
            cl = e % ct
            col = col0 + cl
            if e < total and tl < tok1 - tok0 and col < n_out:
                y = slab[cl * ld + tl] * alpha
                if cutlass.const_expr(cfg.swiglu):
                    up = slab[(cl + ct) * ld + tl] * alpha
                    lim = swiglu_limit
                    gate = cutlass.min(y, lim)
                    up = cutlass.max(cutlass.min(up, lim), -lim)
                    sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-gate))
                    y = gate * sig * up
                outt[tok0 + tl, col] = y.to(BFloat16)
