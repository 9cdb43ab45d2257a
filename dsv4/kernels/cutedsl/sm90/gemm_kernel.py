"""sm_90a NVFP4 GEMM: FP4 decoded in-kernel to FP16, SS-WGMMA with FP32 accumulation.

One kernel class serves the dense and the grouped (MoE) GEMM, with or without the fused SwiGLU
epilogue and split-K. Terms: the *P* operand feeds the WGMMA M side (64 rows per warpgroup), the
*Q* operand the N side. ``swap=False``: P = activations (tokens), Q = weights (prefill);
``swap=True``: P = weights, Q = tokens (decode: few tokens on the narrow N side, 64 weight rows on
the M side).

Per k-tile (``bk`` elements of K) each thread owns fixed "units" (one row x 64 K = 32 packed bytes
+ 4 swizzled scale bytes):
  1. ``cp.async`` global -> raw shared ring (``raw_stages`` deep; zero-fill past M / N / K),
  2. it decodes its own units (no barrier needed: it waits on its own copies) into the FP16
     128B-swizzled WGMMA tile (``f16_stages`` deep),
  3. fence.proxy.async + CTA barrier, then the warpgroups issue WGMMA asynchronously and continue
     with the next tile while it runs.
Epilogue: accumulators -> FP32 shared tile; with split-K, partial tiles go to a workspace and the
last CTA of a tile (atomic counter) sums them in split order (deterministic); then alpha (FP32),
optional SwiGLU, BF16 stores with row/column predication.

Scales are consumed in the 32_4_4 swizzled layout (4 contiguous bytes = one row x 64 K), which
makes the per-unit scale copy one aligned 4-byte ``cp.async``; the host converts linear scales.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import BFloat16, Boolean, Float16, Float32, Int32, Int64, Uint32
from cutlass.cute.nvgpu import warpgroup
from cutlass.tensor_utils import LayoutEnum

from . import ptx
from .grouped_schedule import grouped_schedule

UNIT_K = 64  # K elements per load/decode unit = one 128-byte row of a SW128 FP16 atom
UNIT_BYTES = UNIT_K // 2


@dataclass(frozen=True)
class GemmConfig:
    """Compile-time shape class of one kernel (the executor cache key, with the arch)."""

    swap: bool  # P = weights, Q = tokens
    p_tile: int  # 64 * warpgroups
    q_tile: int  # WGMMA N (multiple of 8)
    bk: int  # K per stage, multiple of 64
    raw_stages: int
    f16_stages: int
    grouped: bool
    swiglu: bool
    split: bool  # split-K support (runtime split count, workspace + counters)
    vec_bytes: int = 16  # 16 when K % 32 == 0 (16-byte aligned rows), else 8

    @property
    def warpgroups(self) -> int:
        return self.p_tile // 64

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    @property
    def token_tile(self) -> int:
        return self.q_tile if self.swap else self.p_tile

    @property
    def weight_tile(self) -> int:
        return self.p_tile if self.swap else self.q_tile

    @property
    def col_tile(self) -> int:
        """Output columns per CTA."""
        return self.weight_tile // 2 if self.swiglu else self.weight_tile

    @property
    def units(self) -> int:
        return (self.p_tile + self.q_tile) * (self.bk // UNIT_K)

    @property
    def stage_ld(self) -> int:
        """Row pitch (floats) of the FP32 epilogue tile; odd for swap (column reads)."""
        return self.q_tile + (1 if self.swap else 4)

    def smem_bytes(self) -> int:
        f16 = max(self.f16_stages * (self.p_tile + self.q_tile) * self.bk * 2,
                  self.p_tile * self.stage_ld * 4)
        raw = self.raw_stages * self.units * (UNIT_BYTES + 4)
        return f16 + raw + 1024 + 256

    def check(self) -> None:
        assert self.p_tile in (64, 128), self.p_tile
        assert self.q_tile % 8 == 0 and 8 <= self.q_tile <= 256, self.q_tile
        assert self.bk % UNIT_K == 0 and self.bk >= UNIT_K, self.bk
        assert self.raw_stages >= 2 and self.f16_stages >= 2
        if self.warpgroups > 1:
            assert self.f16_stages >= 3, "two warpgroups share B: need 3 FP16 stages for overlap"
        if self.swiglu:
            assert self.weight_tile % 16 == 0
        assert self.vec_bytes in (8, 16)
        assert self.smem_bytes() <= 227 * 1024, self.smem_bytes()


class Sm90NvFp4Gemm:
    """Build with a ``GemmConfig``; ``__call__`` is the ``@cute.jit`` launcher to ``cute.compile``."""

    def __init__(self, cfg: GemmConfig):
        cfg.check()
        self.cfg = cfg
        self.tiled_mma = None

    # ------------------------------------------------------------------ host launcher
    @cute.jit
    def __call__(
        self,
        a_words: cute.Pointer,  # Uint8: activations, packed [M, K/2]
        a_scales: cute.Pointer,  # Uint8: swizzled scales of a
        b_words: cute.Pointer,  # Uint8: weights, packed [E*N, K/2]
        b_scales: cute.Pointer,  # Uint8: swizzled scales of b (per expert when grouped)
        alpha_a: cute.Pointer,  # Float32: dense -> a.global_scale (1 elem); grouped -> unused
        alpha_b: cute.Pointer,  # Float32: dense -> b.global_scale; grouped -> alphas [E]
        offsets: cute.Pointer,  # Int32 [E+1] (grouped) / unused
        out: cute.Pointer,  # BFloat16 [M, n_out]
        workspace: cute.Pointer,  # Float32 split-K partials / unused
        counters: cute.Pointer,  # Int32 split-K tile counters (zeroed, self-resetting) / unused
        m: Int32,
        n: Int32,  # weight rows per expert
        k: Int32,
        num_experts: Int32,
        grid_x: Int32,  # token tiles (dense) or token-tile slots (grouped)
        grid_y: Int32,  # weight tiles
        splits: Int32,
        swiglu_limit: Float32,
        stream,
    ):
        cfg = self.cfg
        self.tiled_mma = sm90_utils.make_trivial_tiled_mma(
            Float16, Float16, LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(),
            LayoutEnum.ROW_MAJOR.sm90_mma_major_mode(), Float32, (cfg.warpgroups, 1, 1),
            tiler_mn=(64, cfg.q_tile))
        tile_mnk = (cfg.p_tile, cfg.q_tile, cfg.bk)
        p_layout = sm90_utils.make_smem_layout_a(LayoutEnum.ROW_MAJOR, tile_mnk, Float16, cfg.f16_stages)
        q_layout = sm90_utils.make_smem_layout_b(LayoutEnum.ROW_MAJOR, tile_mnk, Float16, cfg.f16_stages)
        raw_unit_bytes = cfg.units * (UNIT_BYTES + 4)
        # P stages, then Q stages; the FP32 epilogue tile aliases the start after the main loop.
        f16_elems = max(cute.cosize(p_layout) + cute.cosize(q_layout), cfg.p_tile * cfg.stage_ld * 2)

        @cute.struct
        class Storage:
            sched: cute.struct.MemRange[Int32, 48]
            f16: cute.struct.Align[cute.struct.MemRange[Float16, f16_elems], 1024]
            raw: cute.struct.Align[cute.struct.MemRange[cutlass.Uint8, raw_unit_bytes * cfg.raw_stages], 128]

        self.kernel(a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, offsets, out, workspace,
                    counters, m, n, k, num_experts, splits, swiglu_limit, p_layout, q_layout,
                    self.tiled_mma, Storage).launch(
            grid=[grid_x, grid_y, splits], block=[cfg.threads, 1, 1], smem=Storage.size_in_bytes(),
            stream=stream)

    # ------------------------------------------------------------------ device kernel
    @cute.kernel
    def kernel(self, a_words: cute.Pointer, a_scales: cute.Pointer, b_words: cute.Pointer,
               b_scales: cute.Pointer, alpha_a: cute.Pointer, alpha_b: cute.Pointer,
               offsets: cute.Pointer, out: cute.Pointer, workspace: cute.Pointer,
               counters: cute.Pointer, m: Int32, n: Int32, k: Int32, num_experts: Int32,
               splits: Int32, swiglu_limit: Float32, p_layout: cute.ComposedLayout,
               q_layout: cute.ComposedLayout, tiled_mma: cute.TiledMma, Storage: cutlass.Constexpr):
        cfg = self.cfg
        tid, _, _ = cute.arch.thread_idx()
        bx, by, bz = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        st = smem.allocate(Storage)
        sched = st.sched.data_ptr()
        sched_t = cute.make_tensor(sched, cute.make_layout(48))

        # ---------------- which tokens / expert this CTA owns
        tok_start = Int32(0)
        tok_end = Int32(0)
        expert = Int32(0)
        if cutlass.const_expr(cfg.grouped):
            grouped_schedule(offsets, num_experts, bx, tid, sched_t, cfg.token_tile, cfg.threads, False)
            expert = sched_t[0]
            tok_start = sched_t[1]
            tok_end = sched_t[2]
        else:
            tok_start = bx * cfg.token_tile
            tok_end = cutlass.min(m, tok_start + cfg.token_tile)

        if tok_start < tok_end:
            self._tile(a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, out, workspace,
                       counters, m, n, k, num_experts, splits, swiglu_limit, p_layout, q_layout,
                       tiled_mma, st, sched_t, tid, bx, by, bz, expert, tok_start, tok_end)

    # ------------------------------------------------------------------ grouped tile schedule

    # ------------------------------------------------------------------ unit -> source row
    @cute.jit
    def _unit(self, u, by, n, tok_start, tok_end):
        """Unit ``u`` of a k-tile -> (is_p, local row, 64-group, operand row, row valid, is_weight).
        Token units come first so that the mostly-invalid token rows of decode tiles spread over
        the threads instead of doubling one warp's work."""
        cfg = self.cfg
        upg = cfg.bk // UNIT_K
        units_tok = cfg.token_tile * upg
        is_tok = u < units_tok
        v = u - units_tok
        rows = cfg.weight_tile
        if is_tok:
            v = u
            rows = cfg.token_tile
        r = v % rows
        g = v // rows
        grow = Int32(0)
        valid = Boolean(False)
        if is_tok:
            grow = tok_start + r
            valid = grow < tok_end
        else:
            if cutlass.const_expr(cfg.swiglu):
                # weight tile = [gate rows j0..j0+h; up rows of the same j]
                half_w = cfg.weight_tile // 2
                nh = n // 2
                j = by * half_w + r % half_w
                valid = j < nh
                grow = j
                if r >= half_w:
                    grow = j + nh
            else:
                grow = by * cfg.weight_tile + r
                valid = grow < n
        is_w = u >= units_tok
        is_p = is_tok
        if cutlass.const_expr(cfg.swap):
            is_p = is_w  # swap: the weights feed the WGMMA M side
        return is_p, r, g, grow, valid, is_w

    # ------------------------------------------------------------------ k-tile load
    @cute.jit
    def _issue(self, kt, rs, tid, by, k, n, tok_start, tok_end, a_base, b_base, as_base, bs_base,
               raw_addr):
        """``cp.async`` this thread's units of k-tile ``kt`` into raw stage ``rs`` (zero-filled past
        K; units of invalid rows are skipped: their FP16 rows stay zero)."""
        cfg = self.cfg
        T = cfg.threads
        U = cfg.units
        raw_stage_bytes = U * (UNIT_BYTES + 4)
        row_bytes = Int64(k // 2)
        scale_cols = k // 16
        sc_pad = (scale_cols + 3) // 4 * 4
        for i in cutlass.range_constexpr((U + T - 1) // T):
            u = tid + i * T
            if u < U:
                is_p, r, g, grow, valid, is_w = self._unit(u, by, n, tok_start, tok_end)
                if valid:
                    kk = (kt * (cfg.bk // UNIT_K) + g) * UNIT_K  # first K element of the unit
                    kb = cutlass.max(cutlass.min((k - kk) // 2, UNIT_BYTES), 0)  # valid packed bytes
                    src = a_base + Int64(grow) * row_bytes + Int64(kk // 2)
                    sbase = as_base
                    if is_w:
                        src = b_base + Int64(grow) * row_bytes + Int64(kk // 2)
                        sbase = bs_base
                    if kb == 0:
                        src = a_base  # 0 source bytes: never dereferenced, keep a valid address
                    dst = raw_addr + rs * raw_stage_bytes + u * 16
                    dst2 = dst + U * 16
                    if cutlass.const_expr(cfg.vec_bytes == 16):
                        ptx.cp_async_16(dst, src, cutlass.min(kb, 16))
                        ptx.cp_async_16(dst2, src + Int64(16), cutlass.max(kb - 16, 0))
                    else:
                        ptx.cp_async_8(dst, src, cutlass.min(kb, 8))
                        ptx.cp_async_8(dst + 8, src + Int64(8), cutlass.max(cutlass.min(kb - 8, 8), 0))
                        ptx.cp_async_8(dst2, src + Int64(16), cutlass.max(cutlass.min(kb - 16, 8), 0))
                        ptx.cp_async_8(dst2 + 8, src + Int64(24), cutlass.max(kb - 24, 0))
                    # 32_4_4 swizzle: 4 contiguous bytes = row grow, scale columns 4*cg .. 4*cg+3
                    cg = kk // UNIT_K
                    soff = (((grow // 128) * (sc_pad // 4) + cg) * 512 + (grow % 32) * 16
                            + ((grow // 32) % 4) * 4)
                    sb = cutlass.max(cutlass.min(scale_cols - cg * 4, 4), 0)
                    ssrc = sbase + Int64(soff)
                    if sb == 0:
                        ssrc = as_base
                    ptx.cp_async_4(raw_addr + rs * raw_stage_bytes + U * 32 + u * 4, ssrc, sb)

    # ------------------------------------------------------------------ decode to FP16
    @cute.jit
    def _decode(self, rs, fs, tid, by, n, tok_start, tok_end, raw_addr, sp_addr, sq_addr):
        """Decode this thread's units of raw stage ``rs`` into FP16 stage ``fs`` (SW128 K-major:
        row r of 64-wide atom g; its 16-byte chunk c lives at chunk c ^ (r % 8))."""
        cfg = self.cfg
        T = cfg.threads
        U = cfg.units
        raw_stage_bytes = U * (UNIT_BYTES + 4)
        p_stage_bytes = cfg.p_tile * cfg.bk * 2
        q_stage_bytes = cfg.q_tile * cfg.bk * 2
        for i in cutlass.range_constexpr((U + T - 1) // T):
            u = tid + i * T
            if u < U:
                is_p, r, g, grow, valid, is_w = self._unit(u, by, n, tok_start, tok_end)
                if valid:
                    base = raw_addr + rs * raw_stage_bytes
                    w0, w1, w2, w3 = ptx.ld_shared_v4(base + u * 16)
                    w4, w5, w6, w7 = ptx.ld_shared_v4(base + U * 16 + u * 16)
                    s0, s1, s2, s3 = ptx.e4m3x4_to_f16x2_bcast(ptx.ld_shared_u32(base + U * 32 + u * 4))
                    dst = sq_addr + fs * q_stage_bytes + g * (cfg.q_tile * 128) + r * 128
                    if is_p:
                        dst = sp_addr + fs * p_stage_bytes + g * (cfg.p_tile * 128) + r * 128
                    sw = r % 8
                    words = (w0, w1, w2, w3, w4, w5, w6, w7)
                    scl = (s0, s1, s2, s3)
                    for c in cutlass.range_constexpr(8):
                        h0, h1, h2, h3 = ptx.decode_e2m1x8(words[c], scl[c // 2])
                        ptx.st_shared_v4(dst + ((c ^ sw) * 16), h0, h1, h2, h3)

    # ------------------------------------------------------------------ one output tile
    @cute.jit
    def _tile(self, a_words, a_scales, b_words, b_scales, alpha_a, alpha_b, out, workspace,
              counters, m, n, k, num_experts, splits, swiglu_limit, p_layout, q_layout, tiled_mma,
              st, sched_t, tid, bx, by, bz, expert, tok_start, tok_end):
        cfg = self.cfg
        T = cfg.threads
        k_tiles = (k + cfg.bk - 1) // cfg.bk
        per_split = (k_tiles + splits - 1) // splits
        kt0 = bz * per_split
        n_kt = cutlass.max(cutlass.min(k_tiles, kt0 + per_split) - kt0, 0)

        row_bytes = Int64(k // 2)
        sc_pad = ((k // 16) + 3) // 4 * 4
        n_pad = (n + 127) // 128 * 128
        a_base = a_words.toint()
        b_base = b_words.toint() + Int64(expert) * Int64(n) * row_bytes
        as_base = a_scales.toint()
        bs_base = b_scales.toint() + Int64(expert) * Int64(n_pad) * Int64(sc_pad)

        sp_ptr = st.f16.data_ptr()
        sq_ptr = sp_ptr + cute.cosize(p_layout)
        sp_addr = sp_ptr.toint()
        sq_addr = sp_addr + cute.cosize(p_layout) * 2
        raw_addr = st.raw.data_ptr().toint()

        # Zero every FP16 stage once: units of invalid rows are never decoded.
        f16_bytes = (cute.cosize(p_layout) + cute.cosize(q_layout)) * 2
        z = Uint32(0)
        for i in cutlass.range((f16_bytes // 16 + T - 1) // T, unroll=1):
            off = (tid + i * T) * 16
            if off < f16_bytes:
                ptx.st_shared_v4(sp_addr + off, z, z, z, z)

        # ---------------- WGMMA fragments over the FP16 stages
        sP = cute.make_tensor(cute.recast_ptr(sp_ptr, p_layout.inner, dtype=Float16), p_layout.outer)
        sQ = cute.make_tensor(cute.recast_ptr(sq_ptr, q_layout.inner, dtype=Float16), q_layout.outer)
        thr_mma = tiled_mma.get_slice(tid)
        tCrP = tiled_mma.make_fragment_A(thr_mma.partition_A(sP))
        tCrQ = tiled_mma.make_fragment_B(thr_mma.partition_B(sQ))
        ld = cfg.stage_ld
        s_f32 = cute.recast_ptr(sp_ptr, dtype=Float32)
        sS = cute.make_tensor(s_f32, cute.make_layout((cfg.p_tile, cfg.q_tile), stride=(ld, 1)))
        tCsS = thr_mma.partition_C(sS)
        acc = tiled_mma.make_fragment_C(tCsS)
        acc.fill(0.0)
        tiled_mma.set(warpgroup.Field.ACCUMULATE, True)
        k_blocks = cute.size(tCrP, mode=[2])

        # ---------------- main loop: cp.async ring -> decode -> async WGMMA
        for s in cutlass.range_constexpr(cfg.raw_stages - 1):
            if s < n_kt:
                self._issue(kt0 + s, s, tid, by, k, n, tok_start, tok_end, a_base, b_base,
                            as_base, bs_base, raw_addr)
            cute.arch.cp_async_commit_group()
        for i in cutlass.range(n_kt, unroll=1):
            nxt = i + cfg.raw_stages - 1
            if nxt < n_kt:
                self._issue(kt0 + nxt, nxt % cfg.raw_stages, tid, by, k, n, tok_start, tok_end,
                            a_base, b_base, as_base, bs_base, raw_addr)
            cute.arch.cp_async_commit_group()
            cute.arch.cp_async_wait_group(cfg.raw_stages - 1)  # this thread's copies of tile i
            fs = i % cfg.f16_stages
            self._decode(i % cfg.raw_stages, fs, tid, by, n, tok_start, tok_end, raw_addr,
                         sp_addr, sq_addr)
            # generic-proxy smem writes -> visible to the async proxy (WGMMA), then all threads
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            warpgroup.fence()
            for kb in cutlass.range_constexpr(k_blocks):
                cute.gemm(tiled_mma, acc, tCrP[(None, None, kb, fs)], tCrQ[(None, None, kb, fs)], acc)
            warpgroup.commit_group()
            # FP16 stage reuse: the stage written at i+1 was read by WGMMA(i+1-f16_stages); with
            # two warpgroups sharing Q that must be complete before the barrier of iteration i.
            if cutlass.const_expr(cfg.warpgroups == 1):
                warpgroup.wait_group(cfg.f16_stages - 1)
            else:
                warpgroup.wait_group(cfg.f16_stages - 2)
        warpgroup.wait_group(0)
        cute.arch.cp_async_wait_group(0)
        cute.arch.sync_threads()

        # ---------------- epilogue: FP32 tile in shared memory (aliases the FP16 stages)
        for i in cutlass.range_constexpr(cute.size(acc)):
            tCsS[i] = acc[i]
        cute.arch.sync_threads()

        tile_elems = cfg.p_tile * cfg.q_tile
        flat = cute.make_tensor(s_f32, cute.make_layout(cfg.p_tile * ld))
        last = Boolean(True)
        if cutlass.const_expr(cfg.split):
            if splits > 1:
                last = self._split_reduce(flat, workspace, counters, splits, sched_t, tid, bx, by, bz)
        if last:
            self._store(flat, alpha_a, alpha_b, out, m, n, expert, by, tok_start, tok_end,
                        swiglu_limit, tid)

    @cute.jit
    def _split_reduce(self, flat, workspace, counters, splits, sched_t, tid, bx, by, bz):
        """Write this split's FP32 tile; the last split CTA of the tile (atomic counter, reset to 0
        for the next launch) sums all partials in split order into ``flat``. Returns whether this
        CTA is that last one (the others are done)."""
        cfg = self.cfg
        T = cfg.threads
        ld = cfg.stage_ld
        tile_elems = cfg.p_tile * cfg.q_tile
        gx, gy, _ = cute.arch.grid_dim()
        tile_id = bx * gy + by
        base = (tile_id * splits + bz) * tile_elems
        for i in cutlass.range_constexpr((tile_elems + T - 1) // T):
            e = tid + i * T
            if e < tile_elems:
                cute.arch.store(workspace + (base + e), flat[(e // cfg.q_tile) * ld + e % cfg.q_tile])
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_threads()
        if tid == 0:
            cnt_ptr = counters + tile_id
            old = cute.arch.atomic_add(cnt_ptr, Int32(1), sem="acq_rel", scope="gpu")
            is_last = Int32(0)
            if old == splits - 1:
                is_last = Int32(1)
                cute.arch.atomic_exch(cnt_ptr, Int32(0), sem="relaxed", scope="gpu")
            sched_t[4] = is_last
        cute.arch.sync_threads()
        last = sched_t[4] != 0
        if last:
            cute.arch.fence_acq_rel_gpu()
            for i in cutlass.range_constexpr((tile_elems + T - 1) // T):
                e = tid + i * T
                if e < tile_elems:
                    tot = Float32(0.0)
                    # fixed split order (deterministic); unrolled so the L2 loads overlap
                    for zz in cutlass.range(splits, unroll=4):
                        tot = tot + cute.arch.load(
                            workspace + ((tile_id * splits + zz) * tile_elems + e), Float32, cop="cg")
                    flat[(e // cfg.q_tile) * ld + e % cfg.q_tile] = tot
            cute.arch.sync_threads()
        return last

    @cute.jit
    def _store(self, flat, alpha_a, alpha_b, out, m, n, expert, by, tok_start, tok_end,
               swiglu_limit, tid):
        """alpha (FP32) -> optional SwiGLU -> BF16, predicated on valid tokens and columns."""
        cfg = self.cfg
        ld = cfg.stage_ld
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
        col0 = by * ct
        total = cfg.token_tile * ct
        outt = cute.make_tensor(out, cute.make_layout((m, n_out), stride=(n_out, 1)))
        for i in cutlass.range((total + cfg.threads - 1) // cfg.threads, unroll=4):
            e = tid + i * cfg.threads
            tl = e // ct
            cl = e % ct
            row = tok_start + tl
            col = col0 + cl
            if e < total and row < tok_end and col < n_out:
                # (token, weight) -> FP32 tile element; P is the tile's row index
                w = cl
                if cutlass.const_expr(cfg.swap):
                    acc_v = flat[w * ld + tl]
                else:
                    acc_v = flat[tl * ld + w]
                y = acc_v * alpha
                if cutlass.const_expr(cfg.swiglu):
                    w2 = cl + ct
                    up_acc = Float32(0.0)
                    if cutlass.const_expr(cfg.swap):
                        up_acc = flat[w2 * ld + tl]
                    else:
                        up_acc = flat[tl * ld + w2]
                    up = up_acc * alpha
                    lim = swiglu_limit
                    gate = cutlass.min(y, lim)
                    up = cutlass.max(cutlass.min(up, lim), -lim)
                    sig = Float32(1.0) / (Float32(1.0) + cute.math.exp(-gate))
                    y = gate * sig * up
                outt[row, col] = y.to(BFloat16)
