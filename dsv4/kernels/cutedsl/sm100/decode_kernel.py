"""sm_100a NVFP4 GEMM specialised for decode (M <= 16 tokens): swap-AB, split-K, ``tcgen05`` MMAs.

``y[M, N] = alpha * a[M, K] @ b[N, K]^T`` with a = the few tokens, b = the weights. The generic sm_100a
kernel (``kernel.py``) puts the tokens on the MMA M side (128 rows, mostly padding at decode) and has
only ``N / bn`` CTAs; here the operands are swapped so the weights fill the 128-row M side and the
tokens sit on N, padded to ``ntok`` = 8 or 16:

* legal N: ``tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale`` takes M = 128 and
  8 <= N <= 256 in steps of 8. Source: the ``MmaMXF4NVF4Op`` constraints of CuTe DSL 4.8.1
  (``cutlass/cute/nvgpu/tcgen05/mma.py``: "CtaGroup.ONE: Mma-M = 128; 8 <= Mma-N <= 256, step 8",
  enforced by ``BlockScaledMmaOp.__post_init__``), which follow the PTX ISA's tcgen05.mma shape
  table. So N = 8 for 1..8 tokens and 16 for 9..16.
* CTA = 128 threads, one 128-row weight tile (``swiglu``: 128 gate rows and the matching 128 up rows,
  two A operands = batches 0 / 1 of the weight viewed as ``[N/2, K, 2]``, two TMEM accumulators) x all
  tokens x one K range: split-K over ``gridDim.y``, every split owning >= 1 k-tile (host plan).
* warp 0 (TMA producer): fills a ``stages``-deep SMEM ring with A (weights), SFA, B (tokens), SFB.
  warp 1 (MMA issuer): copies the stage's scales SMEM -> TMEM (``tcgen05.cp``) and issues the
  block-scaled MMAs into the TMEM accumulator(s), then releases the stage (``tcgen05.commit``).
* epilogue, all 4 warps (warp w owns TMEM lanes 32w..32w+31 = weight rows): ``tcgen05.ld`` of its
  row's ``ntok`` FP32 values; with split-K each CTA writes its partial to an FP32 workspace and the
  last CTA of the tile (atomic counter, reset to 0 for the next launch) sums all partials in split
  order (deterministic); then alpha (FP32), optional SwiGLU ``silu(min(g,L)) * clamp(u,-L,L)``, BF16,
  stored transposed (``y[token, col]``) under bounds predicates.

Weight rows past N and token rows past M are zero-filled by TMA; the swizzled scales of both are
padded to 128 rows by the contract's layout, so every SF tile is in bounds.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass import Boolean, Float32, Int32
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05

from .kernel import ACC_DTYPE, AB_DTYPE, C_DTYPE, SF_DTYPE, SF_VEC, operand_views
from .layout import SF_TILE_ROWS as SF_ROWS
from .layout import TILE_K, TILE_M

THREADS = 128
TMEM_REGION = 32  # TMEM columns per accumulator / scale-factor region (each needs <= 16)
TOKEN_TILES = (8, 16)  # legal MMA N values used for 1..8 and 9..16 tokens


class Sm100DecodeGemm:
    """Compile-time shape class ``(ntok, swiglu, stages)``; ``__call__`` is the ``@cute.jit`` host entry."""

    def __init__(self, ntok: int, swiglu: bool, stages: int):
        if ntok not in TOKEN_TILES or stages < 2:
            raise ValueError(f"decode shape class: ntok in {TOKEN_TILES} and stages >= 2, found {ntok}, {stages}")
        self.ntok = ntok
        self.swiglu = swiglu
        self.num_a = 2 if swiglu else 1
        self.mma_tiler = (TILE_M, ntok, TILE_K)
        self.mma_tiler_sfb = (TILE_M, SF_ROWS, TILE_K)
        self.stages = stages  # ring depth: decode_launch.decode_stages (SMEM budget)
        # TMEM: [acc0 | acc1 | SFA0 | SFA1 | SFB], each region on a 32-column boundary (the ntok-wide
        # accumulators would otherwise put the scales at 8/16-column offsets, an alignment CUTLASS's
        # block-scaled kernels never use); the allocation is a power of two >= 32 columns.
        used = TMEM_REGION * (2 * self.num_a + 1)
        self.tmem_cols = max(32, 1 << (used - 1).bit_length())

    @cute.jit
    def __call__(
        self,
        w_ptr: cute.Pointer,  # FP4 weights [lb * n_out, K] K-major (MMA A)
        x_ptr: cute.Pointer,  # FP4 tokens [M, K] K-major (MMA B)
        wsf_ptr: cute.Pointer,  # E4M3 32_4_4 swizzled, per weight batch of n_out rows
        xsf_ptr: cute.Pointer,  # E4M3 32_4_4 swizzled [round_up(M,128) * round_up(K/16,4)]
        out_ptr: cute.Pointer,  # BF16 [M, n_out]
        alpha_a: cute.Pointer,  # FP32 [1]: tokens' global scale
        alpha_b: cute.Pointer,  # FP32 [1]: weights' global scale
        workspace: cute.Pointer,  # FP32 [tiles, splits, num_a, 128, ntok] (split-K only)
        counters: cute.Pointer,  # Int32 [tiles], zero; the kernel leaves them zero (split-K only)
        m: Int32,
        n_out: Int32,  # weight rows per batch = output columns
        k: Int32,
        lb: Int32,  # weight batches: 1, or 2 with SwiGLU (gate, up)
        tiles: Int32,  # grid.x
        splits: Int32,  # grid.y
        swiglu_limit: Float32,
        stream,
    ):
        x, w, xsf, wsf = operand_views(x_ptr, w_ptr, xsf_ptr, wsf_ptr, m, n_out, k, lb)
        # the output in MMA space: C[row = output column, col = token] = y[token, row]
        c = cute.make_tensor(out_ptr, cute.make_layout((n_out, m), stride=(1, n_out)))

        tiled_mma, tiled_mma_sfb, atoms, smem, tx_bytes = self.operand_atoms(w, x, wsf, xsf)
        tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb = atoms
        a_smem, b_smem, sfa_smem, sfb_smem = smem

        self.kernel(tiled_mma, tiled_mma_sfb, tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb, c,
                    alpha_a, alpha_b, workspace, counters, a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes,
                    splits, swiglu_limit).launch(grid=(tiles, splits, 1), block=[THREADS, 1, 1],
                                                 cluster=(1, 1, 1), stream=stream)

    def operand_atoms(self, w, x, wsf, xsf):
        """The MMA (and its N = 128 twin for the token scales), the shared-memory ring layouts, the TMA
        atoms of the weights, tokens and their scales, and the bytes one ring stage receives. Plain
        Python, traced inline by the ``@cute.jit`` host entries (this kernel's and the grouped one's)."""
        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            AB_DTYPE, AB_DTYPE, OperandMajorMode.K, OperandMajorMode.K, SF_DTYPE, SF_VEC,
            tcgen05.CtaGroup.ONE, self.mma_tiler[:2])
        # SFB moves as whole 128-row scale atoms: its TMA uses an N = 128 twin of the MMA (the
        # CUTLASS block-scaled kernels' tiled_mma_sfb); rows past ntok are never read by the MMA.
        tiled_mma_sfb = sm100_utils.make_blockscaled_trivial_tiled_mma(
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
        # scale tiles move as 16-bit elements (the 16-wide K vector of the SF atom has stride 0)
        tma_sfa, tma_tsfa = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, wsf, sfa1, self.mma_tiler, tiled_mma, shp, internal_type=cutlass.Int16)
        tma_sfb, tma_tsfb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, xsf, sfb1, self.mma_tiler_sfb, tiled_mma_sfb, shp, internal_type=cutlass.Int16)
        tx_bytes = (self.num_a * (cute.size_in_bytes(AB_DTYPE, a1) + cute.size_in_bytes(SF_DTYPE, sfa1))
                    + cute.size_in_bytes(AB_DTYPE, b1) + cute.size_in_bytes(SF_DTYPE, sfb1))
        return (tiled_mma, tiled_mma_sfb, (tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb),
                (a_smem, b_smem, sfa_smem, sfb_smem), tx_bytes)

    @cute.kernel
    def kernel(self, tiled_mma: cute.TiledMma, tiled_mma_sfb: cute.TiledMma, tma_a: cute.CopyAtom, mA: cute.Tensor,
               tma_b: cute.CopyAtom, mB: cute.Tensor, tma_sfa: cute.CopyAtom, mSFA: cute.Tensor,
               tma_sfb: cute.CopyAtom, mSFB: cute.Tensor, mC: cute.Tensor, alpha_a: cute.Pointer,
               alpha_b: cute.Pointer, workspace: cute.Pointer, counters: cute.Pointer,
               a_smem: cute.ComposedLayout, b_smem: cute.ComposedLayout, sfa_smem: cute.Layout,
               sfb_smem: cute.Layout, tx_bytes: cutlass.Constexpr, splits: Int32, swiglu_limit: Float32):
        tile, split, _ = cute.arch.block_idx()
        self._cta(tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, mC, alpha_a, alpha_b,
                  workspace, counters, a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes, tile, split, 0, 0, splits,
                  swiglu_limit)

    @cute.jit
    def _cta(self, tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, mC, alpha_a, alpha_b,
             workspace, counters, a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes: cutlass.Constexpr, tile, split,
             slot, wb0, splits, swiglu_limit):
        """One CTA: output tile ``tile`` over K range ``split``, weight batch ``wb0`` (``wb0 + 1``: the up
        half) and token batch ``slot`` (both 0 here; the grouped kernel passes an expert's and a slot's)."""
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

        # ---- this split's K range: per = ceil(k_tiles / splits) k-tiles, the last split the rest
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
        tAgA0 = tAgA[(None, tile, None, wb0)]  # ((atom_v, rest_v), RestK): gate (or the only) batch
        tAgSFA0 = tAgSFA[(None, tile, None, wb0)]
        tAgA1, tAgSFA1 = tAgA0, tAgSFA0
        if cutlass.const_expr(self.swiglu):
            tAgA1 = tAgA[(None, tile, None, wb0 + 1)]
            tAgSFA1 = tAgSFA[(None, tile, None, wb0 + 1)]
        tBgB = tBgB[(None, 0, None, slot)]   # the tokens (the grouped kernel: a slot's gathered tile)
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

    @cute.jit
    def _epilogue(self, tidx, tiled_mma, tAcc0, tAcc1, mC, alpha_a, alpha_b, workspace, counters,
                  storage, tile, split, splits, n_kt, limit, acc_consumer):
        tile_mn = cute.slice_(self.mma_tiler, (None, None, 0))
        thr_mma = tiled_mma.get_slice(0)
        gC = cute.local_tile(mC, tile_mn, (tile, 0))
        cC = cute.local_tile(cute.make_identity_tensor(mC.shape), tile_mn, (tile, 0))
        tCgC = thr_mma.partition_C(gC)[((None, None), 0, 0)]
        tCcC = thr_mma.partition_C(cC)[((None, None), 0, 0)]
        # one tcgen05.ld 32x32b.x{ntok} per accumulator: thread t reads lane t (= weight row t)
        rep = tcgen05.Repetition.x8 if cutlass.const_expr(self.ntok == 8) else tcgen05.Repetition.x16
        t2r = tcgen05.make_tmem_copy(cute.make_copy_atom(tcgen05.Ld32x32bOp(rep, tcgen05.Pack.NONE), ACC_DTYPE),
                                     tAcc0[((None, None), 0, 0)])
        thr = t2r.get_slice(tidx)
        tTR_t0 = thr.partition_S(tAcc0[((None, None), 0, 0)])
        tTR_t1 = thr.partition_S(tAcc1[((None, None), 0, 0)])
        tTR_g = thr.partition_D(tCgC)
        tTR_c = thr.partition_D(tCcC)
        r0 = cute.make_rmem_tensor(tTR_g.shape, ACC_DTYPE)
        r1 = cute.make_rmem_tensor(tTR_g.shape, ACC_DTYPE)
        rC = cute.make_rmem_tensor(tTR_g.shape, C_DTYPE)

        acc_full = acc_consumer.wait_and_advance()
        cute.copy(t2r, tTR_t0, r0)
        if cutlass.const_expr(self.swiglu):
            cute.copy(t2r, tTR_t1, r1)
        cute.arch.fence_view_async_tmem_load()  # tcgen05.wait::ld before the TMEM is released
        acc_full.release()
        if n_kt == 0:  # an empty split (the plan never makes one) contributes zeros, not stale TMEM
            r0.fill(0.0)
            r1.fill(0.0)

        last = Boolean(True)
        if splits > 1:
            last = self._split_reduce(r0, r1, tTR_c, workspace, counters, storage, tile, split, splits, tidx)
        if last:
            alpha = (cute.make_tensor(alpha_a, cute.make_layout(1))[0]
                     * cute.make_tensor(alpha_b, cute.make_layout(1))[0])
            for i in cutlass.range_constexpr(cute.size(r0)):
                v = r0[i] * alpha
                if cutlass.const_expr(self.swiglu):
                    g = cutlass.min(v, limit)
                    u = cutlass.max(cutlass.min(r1[i] * alpha, limit), -limit)
                    # silu of the CLAMPED gate (contract.GemmRequest), IEEE division
                    v = g / (Float32(1.0) + cute.math.exp(-g, fastmath=False)) * u
                rC[i] = v.to(C_DTYPE)
            n_out, m = mC.shape
            for i in cutlass.range_constexpr(cute.size(rC)):
                row, col = tTR_c[i]
                if row < n_out and col < m:
                    tTR_g[i] = rC[i]

    @cute.jit
    def _split_reduce(self, r0, r1, tTR_c, workspace, counters, storage, tile, split, splits, tidx):
        """Write this split's FP32 partial; the last split CTA of the tile sums every split's partial in
        split order (fixed order: deterministic) into ``r0`` / ``r1``. Returns whether this CTA is last."""
        per_acc = TILE_M * self.ntok
        per_split = self.num_a * per_acc
        base = (tile * splits + split) * per_split
        flag_t = cute.make_tensor(storage.is_last.ptr, cute.make_layout(1))
        for i in cutlass.range_constexpr(cute.size(r0)):
            row, col = tTR_c[i]
            e = (row - tile * TILE_M) * self.ntok + col
            cute.arch.store(workspace + (base + e), r0[i])
            if cutlass.const_expr(self.swiglu):
                cute.arch.store(workspace + (base + per_acc + e), r1[i])
        cute.arch.fence_acq_rel_gpu()
        cute.arch.barrier()
        if tidx == 0:
            cnt = counters + tile
            old = cute.arch.atomic_add(cnt, Int32(1), sem="acq_rel", scope="gpu")
            flag = Int32(0)
            if old == splits - 1:
                flag = Int32(1)
                cute.arch.atomic_exch(cnt, Int32(0), sem="relaxed", scope="gpu")  # ready for the next launch
            flag_t[0] = flag
        cute.arch.barrier()
        last = flag_t[0] != 0
        if last:
            cute.arch.fence_acq_rel_gpu()
            t0 = tile * splits * per_split
            for i in cutlass.range_constexpr(cute.size(r0)):
                row, col = tTR_c[i]
                e = (row - tile * TILE_M) * self.ntok + col
                s0 = Float32(0.0)
                s1 = Float32(0.0)
                for z in cutlass.range(splits, unroll=1):
                    off = t0 + z * per_split + e
                    s0 = s0 + cute.arch.load(workspace + off, Float32, cop="cg")
                    if cutlass.const_expr(self.swiglu):
                        s1 = s1 + cute.arch.load(workspace + (off + per_acc), Float32, cop="cg")
                r0[i] = s0
                r1[i] = s1
        return last


def _stage0(smem_layout):
    """One stage of a staged SF SMEM layout."""
    return cute.slice_(smem_layout, (None, None, None, 0))


@cute.jit
def _s2t(atom, sSF: cute.Tensor, tSF: cute.Tensor):
    """``tcgen05.cp`` SMEM -> TMEM copy of a scale-factor tile: (tiled copy, source descs, dest)."""
    src = cute.filter_zeros(sSF)
    dst = cute.filter_zeros(tSF)
    tiled = tcgen05.make_s2t_copy(atom, dst)
    thr = tiled.get_slice(0)
    return tiled, tcgen05.get_s2t_smem_desc_tensor(tiled, thr.partition_S(src)), thr.partition_D(dst)
