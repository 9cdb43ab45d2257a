"""sm_100a grouped (MoE) NVFP4 GEMM at decode sizes: the dense decode kernel (``decode_kernel.py``:
swap-AB, ``tcgen05`` block-scaled MMA into TMEM, split-K) over a third grid axis of token-tile slots.

``y[rows, N] = alphas[e] * a[rows of e, K] @ b_e[N, K]^T`` for every expert ``e`` (its rows
``offsets[e]:offsets[e+1]``), routed sparsely (about one row per expert at decode).

Design: the tokens reach this kernel already gathered. ``token_gather_kernel.py`` (one small launch
before this one) gives every slot ``s`` (grid.z) one expert's next ``ntok`` rows as batch ``s`` of a
token operand ``[ntok, K, slots]`` whose scales hold one 128-row 32_4_4 atom per slot, and writes the
slot's ``(expert, row_lo, row_hi)``. Why: the token-scale TMA moves whole 128-row atoms (tiles of the
atom-shaped layout) and the MMA reads the scales of its ``ntok`` tokens from rows 0..ntok-1 of the atom
in TMEM, while an expert's rows start at any row of the caller's atoms. The alternatives (scales
stored into SMEM by the producer warp through the generic proxy, or an offset TMEM address for SFB)
change the MMA's scale addressing, which no B200 here could check. The gather moves ``ntok * K / 2``
bytes plus one scale atom per slot (against ``128 * K / 2`` weight bytes per CTA) and keeps this kernel
the dense kernel's data path with two index changes: weight batch ``e * num_a`` (``+ 1``: up) for the
expert, token batch ``s`` for the slot. Everything is decided on the device (CUDA-graph capturable).

Per CTA ``(tile, split, slot)``: read the slot's row; an empty slot (``row_lo == row_hi``: the slot
count is a bound from shapes alone) returns before touching SMEM, barriers or TMEM. Otherwise the dense
kernel's warp roles, ring and epilogue. The epilogue (``Sm100DecodeGemm._epilogue``, reused) gets the
slot's output rows ``y[row_lo:row_hi]`` as its ``C``, ``alpha = a.global_scale * b.global_scale[e]``
(FP32: the contract's ``alphas[e]`` bit for bit) and the slot's own split-K workspace and tile counters
(``workspace + slot * tiles * splits * partial``, ``counters + slot * tiles``).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05

from .decode_kernel import THREADS, TMEM_REGION, Sm100DecodeGemm, _s2t, _stage0
from .kernel import ACC_DTYPE, AB_DTYPE, SF_DTYPE, SF_VEC, operand_views
from .layout import SF_TILE_ROWS as SF_ROWS
from .layout import TILE_M


class Sm100GroupedDecodeGemm(Sm100DecodeGemm):
    """Compile-time shape class ``(ntok, swiglu, stages)`` as the dense kernel; ``__call__`` is the
    ``@cute.jit`` host entry."""

    @cute.jit
    def __call__(
        self,
        w_ptr: cute.Pointer,  # FP4 weights [E * n, K] K-major, viewed as lb = E * num_a batches
        x_ptr: cute.Pointer,  # FP4 gathered tokens [slots * ntok, K] (token_tiles)
        wsf_ptr: cute.Pointer,  # E4M3 32_4_4 swizzled per weight batch of n_out rows
        xsf_ptr: cute.Pointer,  # E4M3 32_4_4, one 128-row atom per slot
        out_ptr: cute.Pointer,  # BF16 [rows, n_out]
        alpha_a: cute.Pointer,  # FP32 [1]: the tokens' global scale
        alpha_b: cute.Pointer,  # FP32 [E]: the experts' global scales
        sched_ptr: cute.Pointer,  # Int32 [slots, 4]: (expert, row_lo, row_hi, 0)
        workspace: cute.Pointer,  # FP32 [slots, tiles, splits, num_a, 128, ntok] (split-K only)
        counters: cute.Pointer,  # Int32 [slots * tiles], zero; left zero (split-K only)
        n_out: Int32,  # weight rows per batch = output columns
        k: Int32,
        lb: Int32,  # weight batches: E, or 2E with SwiGLU (gate 2e, up 2e + 1)
        slots: Int32,  # grid.z
        tiles: Int32,  # grid.x
        splits: Int32,  # grid.y
        swiglu_limit: Float32,
        stream,
    ):
        _, w, _, wsf = operand_views(w_ptr, w_ptr, wsf_ptr, wsf_ptr, 1, n_out, k, lb)
        _, x, _, xsf = operand_views(x_ptr, x_ptr, xsf_ptr, xsf_ptr, 1, self.ntok, k, slots)
        sched = cute.make_tensor(sched_ptr, cute.make_layout((slots, 4), stride=(4, 1)))

        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            AB_DTYPE, AB_DTYPE, OperandMajorMode.K, OperandMajorMode.K, SF_DTYPE, SF_VEC,
            tcgen05.CtaGroup.ONE, self.mma_tiler[:2])
        tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(  # SFB as whole 128-row atoms
            AB_DTYPE, AB_DTYPE, OperandMajorMode.K, OperandMajorMode.K, SF_DTYPE, SF_VEC,
            tcgen05.CtaGroup.ONE, (TILE_M, SF_ROWS))
        cluster_vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,))
        a_smem = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, AB_DTYPE, self.stages)
        b_smem = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, AB_DTYPE, self.stages)
        sfa_smem = blockscaled_utils.make_smem_layout_sfa(tiled_mma, self.mma_tiler, SF_VEC, self.stages)
        sfb_smem = blockscaled_utils.make_smem_layout_sfb(tiled_mma, self.mma_tiler, SF_VEC, self.stages)

        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        one = (None, None, None, 0)
        a1, b1 = cute.slice_(a_smem, one), cute.slice_(b_smem, one)
        sfa1, sfb1 = cute.slice_(sfa_smem, one), cute.slice_(sfb_smem, one)
        shp = cluster_vmnk.shape
        tma_a, tma_ta = cute.nvgpu.make_tiled_tma_atom_A(g2s, w, a1, self.mma_tiler, tiled_mma, shp)
        tma_b, tma_tb = cute.nvgpu.make_tiled_tma_atom_B(g2s, x, b1, self.mma_tiler, tiled_mma, shp)
        tma_sfa, tma_tsfa = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, wsf, sfa1, self.mma_tiler, tiled_mma, shp, internal_type=cutlass.Int16)
        tma_sfb, tma_tsfb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, xsf, sfb1, self.mma_tiler_sfb, tiled_mma_sfb, shp, internal_type=cutlass.Int16)
        tx_bytes = (self.num_a * (cute.size_in_bytes(AB_DTYPE, a1) + cute.size_in_bytes(SF_DTYPE, sfa1))
                    + cute.size_in_bytes(AB_DTYPE, b1) + cute.size_in_bytes(SF_DTYPE, sfb1))

        self.grouped_kernel(
            tiled_mma, tiled_mma_sfb, tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb,
            out_ptr, alpha_a, alpha_b, sched, workspace, counters, a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes,
            n_out, splits, swiglu_limit).launch(grid=(tiles, splits, slots), block=[THREADS, 1, 1],
                                                cluster=(1, 1, 1), stream=stream)

    @cute.kernel
    def grouped_kernel(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma, tma_a: cute.CopyAtom,
                       mA: cute.Tensor, tma_b: cute.CopyAtom, mB: cute.Tensor, tma_sfa: cute.CopyAtom,
                       mSFA: cute.Tensor, tma_sfb: cute.CopyAtom, mSFB: cute.Tensor, out_ptr: cute.Pointer,
                       alpha_a: cute.Pointer, alpha_b: cute.Pointer, sched: cute.Tensor, workspace: cute.Pointer,
                       counters: cute.Pointer, a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout,
                       sfa_smem: cute.Layout, sfb_smem: cute.Layout, tx_bytes: cutlass.Constexpr,
                       n_out: Int32, splits: Int32, swiglu_limit: Float32):
        tile, split, slot = cute.arch.block_idx()
        gx, _, _ = cute.arch.grid_dim()
        expert = sched[slot, 0]
        row_lo = sched[slot, 1]
        row_hi = sched[slot, 2]
        if row_lo < row_hi:  # uniform per CTA: an empty slot leaves before any barrier or TMEM use
            # this slot's output rows, split-K partials and tile counters
            c = cute.make_tensor(out_ptr + row_lo * n_out,
                                 cute.make_layout((n_out, row_hi - row_lo), stride=(1, n_out)))
            partials = gx * splits * (self.num_a * TILE_M * self.ntok)
            self._slot_tile(tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, c,
                            alpha_a, alpha_b + expert, workspace + slot * partials, counters + slot * gx,
                            a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes, tile, split, slot,
                            expert * self.num_a, splits, swiglu_limit)

    @cute.jit
    def _slot_tile(self, tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, mC,
                   alpha_a, alpha_b, workspace, counters, a_smem, b_smem, sfa_smem, sfb_smem,
                   tx_bytes: cutlass.Constexpr, tile, split, slot, wb0, splits, swiglu_limit):
        """The dense kernel's CTA with weight batch ``wb0`` (``wb0 + 1``: up) and token batch ``slot``."""
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_holding_buf: Int32
            is_last: Int32

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sA0 = smem.allocate_tensor(AB_DTYPE, a_smem.outer, byte_alignment=128, swizzle=a_smem.inner)
        sSFA0 = smem.allocate_tensor(SF_DTYPE, sfa_smem, byte_alignment=128)
        sB = smem.allocate_tensor(AB_DTYPE, b_smem.outer, byte_alignment=128, swizzle=b_smem.inner)
        sSFB = smem.allocate_tensor(SF_DTYPE, sfb_smem, byte_alignment=128)
        sA1, sSFA1 = sA0, sSFA0
        if cutlass.const_expr(self.swiglu):
            sA1 = smem.allocate_tensor(AB_DTYPE, a_smem.outer, byte_alignment=128, swizzle=a_smem.inner)
            sSFA1 = smem.allocate_tensor(SF_DTYPE, sfa_smem, byte_alignment=128)

        thread1 = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        ab_producer, ab_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar.data_ptr(), num_stages=self.stages, producer_group=thread1,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=tx_bytes).make_participants()
        acc_producer, acc_consumer = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar.data_ptr(), num_stages=1, producer_group=thread1,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS)).make_participants()

        # ---- this split's K range (as the dense kernel) -------------------------------------------
        tile_mk = cute.slice_(self.mma_tiler, (None, 0, None))
        tile_nk = cute.slice_(self.mma_tiler, (0, None, None))
        gA = cute.local_tile(mA, tile_mk, (None, None, None))  # (bM, bK, RestM, RestK, RestL)
        gB = cute.local_tile(mB, tile_nk, (None, None, None))
        gSFA = cute.local_tile(mSFA, tile_mk, (None, None, None))
        gSFB = cute.local_tile(mSFB, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        k_tiles = cute.size(gA, mode=[3])
        per = (k_tiles + splits - 1) // splits
        kt0 = split * per
        n_kt = cutlass.max(cutlass.min(k_tiles, kt0 + per) - kt0, 0)

        thr_mma = tiled_mma.get_slice(0)
        thr_mma_sfb = tiled_mma_sfb.get_slice(0)
        lay1 = cute.make_layout(1)

        def part(atom, s, g, a_side, thr=thr_mma):  # TMA partition of (smem, gmem) tiles
            gp = thr.partition_A(g) if a_side else thr.partition_B(g)
            return cpasync.tma_partition(atom, 0, lay1, cute.group_modes(s, 0, 3), cute.group_modes(gp, 0, 3))

        tAsA0, tAgA = part(tma_a, sA0, gA, True)
        tAsA1, _ = part(tma_a, sA1, gA, True)
        tBsB, tBgB = part(tma_b, sB, gB, False)
        tAsSFA0, tAgSFA = part(tma_sfa, sSFA0, gSFA, True)
        tAsSFA1, _ = part(tma_sfa, sSFA1, gSFA, True)
        tBsSFB, tBgSFB = part(tma_sfb, sSFB, gSFB, False, thr_mma_sfb)
        tAsSFA0, tAsSFA1, tAgSFA = (cute.filter_zeros(tAsSFA0), cute.filter_zeros(tAsSFA1),
                                    cute.filter_zeros(tAgSFA))
        tBsSFB, tBgSFB = cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB)
        tAgA0 = tAgA[(None, tile, None, wb0)]  # ((atom_v, rest_v), RestK): the expert's gate (or only) batch
        tAgSFA0 = tAgSFA[(None, tile, None, wb0)]
        tAgA1, tAgSFA1 = tAgA0, tAgSFA0
        if cutlass.const_expr(self.swiglu):
            tAgA1 = tAgA[(None, tile, None, wb0 + 1)]
            tAgSFA1 = tAgSFA[(None, tile, None, wb0 + 1)]
        tBgB = tBgB[(None, 0, None, slot)]  # the slot's gathered tokens and their scale atom
        tBgSFB = tBgSFB[(None, 0, None, slot)]

        # ---- TMEM: [acc0 | acc1 | SFA0 | SFA1 | SFB] --------------------------------------------
        tCrA0 = tiled_mma.make_fragment_A(sA0)
        tCrA1 = tiled_mma.make_fragment_A(sA1)
        tCrB = tiled_mma.make_fragment_B(sB)
        acc_fake = tiled_mma.make_fragment_C(tiled_mma.partition_shape_C(self.mma_tiler[:2]))
        tmem_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=THREADS)
        tmem = cutlass.memory.TmemAllocator(storage.tmem_holding_buf.ptr, barrier_for_retrieve=tmem_bar)
        tmem.allocate(self.tmem_cols)
        tmem.wait_for_alloc()
        acc_base = tmem.retrieve_ptr(ACC_DTYPE)
        tAcc0 = cute.make_tensor(acc_base, acc_fake.layout)
        tAcc1 = tAcc0
        if cutlass.const_expr(self.swiglu):
            tAcc1 = cute.make_tensor(acc_base + TMEM_REGION, acc_fake.layout)
        sf_base = acc_base + self.num_a * TMEM_REGION
        sfa_layout = blockscaled_utils.make_tmem_layout_sfa(tiled_mma, self.mma_tiler, SF_VEC, _stage0(sfa_smem))
        tCtSFA0 = cute.make_tensor(cute.recast_ptr(sf_base, dtype=SF_DTYPE), sfa_layout)
        tCtSFA1 = tCtSFA0
        if cutlass.const_expr(self.swiglu):
            tCtSFA1 = cute.make_tensor(cute.recast_ptr(sf_base + TMEM_REGION, dtype=SF_DTYPE), sfa_layout)
        sfb_layout = blockscaled_utils.make_tmem_layout_sfb(tiled_mma, self.mma_tiler, SF_VEC, _stage0(sfb_smem))
        tCtSFB = cute.make_tensor(cute.recast_ptr(sf_base + self.num_a * TMEM_REGION, dtype=SF_DTYPE), sfb_layout)

        for t in (tAcc0, tCtSFA0, tCtSFB):  # trace-time: every region fits its 32 columns
            assert tcgen05.find_tmem_tensor_col_offset(t) <= TMEM_REGION, t.layout
        s2t_atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), SF_DTYPE)
        s2t_sfa0, s2t_sfa0_src, s2t_sfa0_dst = _s2t(s2t_atom, sSFA0, tCtSFA0)
        s2t_sfa1, s2t_sfa1_src, s2t_sfa1_dst = _s2t(s2t_atom, sSFA1, tCtSFA1)
        s2t_sfb, s2t_sfb_src, s2t_sfb_dst = _s2t(s2t_atom, sSFB, tCtSFB)

        if warp_idx == 0:  # ---- TMA producer --------------------------------------------------------
            for i in cutlass.range(n_kt, unroll=1):
                empty = ab_producer.acquire_and_advance()
                kc, si, bar = kt0 + i, empty.index, empty.barrier
                cute.copy(tma_a, tAgA0[(None, kc)], tAsA0[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_sfa, tAgSFA0[(None, kc)], tAsSFA0[(None, si)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.swiglu):
                    cute.copy(tma_a, tAgA1[(None, kc)], tAsA1[(None, si)], tma_bar_ptr=bar)
                    cute.copy(tma_sfa, tAgSFA1[(None, kc)], tAsSFA1[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB[(None, kc)], tBsB[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_sfb, tBgSFB[(None, kc)], tBsSFB[(None, si)], tma_bar_ptr=bar)
            ab_producer.tail()
        if warp_idx == 1:  # ---- MMA issuer: scales -> TMEM, block-scaled MMAs --------------------
            acc_empty = acc_producer.acquire_and_advance()
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for _i in cutlass.range(n_kt, unroll=1):
                full = ab_consumer.wait_and_advance()
                st = (None, None, None, None, full.index)
                cute.copy(s2t_sfa0, s2t_sfa0_src[st], s2t_sfa0_dst)
                cute.copy(s2t_sfb, s2t_sfb_src[st], s2t_sfb_dst)
                if cutlass.const_expr(self.swiglu):
                    cute.copy(s2t_sfa1, s2t_sfa1_src[st], s2t_sfa1_dst)
                for kb in cutlass.range(cute.size(tCrA0, mode=[2]), unroll_full=True):
                    kcoord = (None, None, kb, full.index)
                    sfk = (None, None, kb)
                    tiled_mma.set(tcgen05.Field.SFA, tCtSFA0[sfk].iterator)
                    tiled_mma.set(tcgen05.Field.SFB, tCtSFB[sfk].iterator)
                    cute.gemm(tiled_mma, tAcc0, tCrA0[kcoord], tCrB[kcoord], tAcc0)
                    if cutlass.const_expr(self.swiglu):
                        tiled_mma.set(tcgen05.Field.SFA, tCtSFA1[sfk].iterator)
                        cute.gemm(tiled_mma, tAcc1, tCrA1[kcoord], tCrB[kcoord], tAcc1)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                full.release()
            acc_empty.commit()

        tmem.relinquish_alloc_permit()
        self._epilogue(tidx, tiled_mma, tAcc0, tAcc1, mC, alpha_a, alpha_b, workspace, counters,
                       storage, tile, split, splits, n_kt, swiglu_limit, acc_consumer)
        cute.arch.barrier()
        tmem.free(acc_base)
