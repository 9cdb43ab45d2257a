"""The sm_100a NVFP4 block-scaled GEMM kernel (``tcgen05.mma ... kind::mxf4nvf4.block_scale``).

One kernel class, specialised at compile time by two flags and the tile N (``layout.CONFIGS``):

* ``grouped``: False -> dense ``y[M, N]``; CTA ``x`` is the M tile. True -> MoE grouped GEMM; CTA ``x``
  reads one row ``(expert, m_tile, row_lo, row_hi)`` of a work schedule built on the device
  (``device_schedule.py``; a row with ``row_lo == row_hi`` stores nothing).
* ``swiglu``: False -> one B operand, ``y = alpha * acc``. True -> two B operands (the gate and the up
  half of the weight, batch indices ``2e`` and ``2e + 1`` of B viewed as ``[n/2, K, 2E]``), two TMEM
  accumulators, and the fused epilogue ``silu(min(g, L)) * clamp(u, -L, L)``.

Structure (after the approach of CUTLASS's Blackwell NVFP4 tutorial, written for this contract):
128 threads, one 128 x ``bn`` output tile per CTA, ``cta_group::1`` MMAs of 128 x ``bn`` x 64.
Warp 0 issues the TMA loads of A, B, SFA, SFB into a multi-stage SMEM ring and, in the same loop,
copies the scale factors SMEM -> TMEM (``tcgen05.cp``) and issues the block-scaled MMAs (the MMA and
the copy are issued by the same thread, so the tensor core orders them). All four warps then read
the FP32 accumulator from TMEM in 32-column chunks (``tcgen05.ld``), multiply by the FP32 alpha,
apply the optional SwiGLU in FP32, convert to BF16 and store with per-element bounds predicates.

Tiles are aligned to the global 128-row grid of A, so SFA tiles are whole 32_4_4 atoms of the
contract's swizzled layout (no repacking). Rows outside ``[row_lo, row_hi)`` (another expert's rows,
or the zero rows TMA returns past M) are computed and discarded; out-of-range K and N are
zero-filled by TMA, so they add exact zeros to the accumulator.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, tcgen05

from ...contract import FP4_BLOCK
from .layout import TILE_K, TILE_M, TMA_K_MULTIPLE

AB_DTYPE = cutlass.Float4E2M1FN
SF_DTYPE = cutlass.Float8E4M3FN
C_DTYPE = cutlass.BFloat16
ACC_DTYPE = cutlass.Float32
SF_VEC = FP4_BLOCK
MMA_K = 64  # K of one mxf4nvf4 MMA instruction; TILE_K = 4 MMAs = 128 bytes of FP4 per row
EPI_N = 32  # epilogue chunk: one tcgen05.ld 32x32b.x32 per thread
THREADS = 128
SMEM_BYTES = 232448  # sm_100 opt-in shared memory per CTA (227 KiB)
SMEM_RESERVED = 4096  # barriers, TMEM handle, 1 KiB alignment of the swizzled tiles


def stage_bytes(bn: int, num_b: int) -> int:
    """SMEM bytes of one pipeline stage: A and B tiles (4 bits each) plus SFA/SFB (one byte per 16)."""
    a = TILE_M * TILE_K // 2
    b = bn * TILE_K // 2
    sfa = TILE_M * TILE_K // SF_VEC
    sfb = ((bn + 127) // 128 * 128) * TILE_K // SF_VEC
    return a + sfa + num_b * (b + sfb)


def num_stages(bn: int, num_b: int, max_stages: int = 6) -> int:
    return max(2, min(max_stages, (SMEM_BYTES - SMEM_RESERVED) // stage_bytes(bn, num_b)))


def operand_views(a_ptr, b_ptr, sfa_ptr, sfb_ptr, m, nb, k, lb):
    """The kernel's global tensors over the contract's bytes (also run host-only by ``host_view``).

    A ``(M, K, 1)`` and B ``(NB, K, LB)`` are K-major FP4; SFA / SFB are the swizzled scale bytes seen
    through the tcgen05 scale-factor atom ``((32,4),(16,4)) : ((16,4),(0,1))`` tiled over
    (rows, K, batch), so the batch stride is ``round_up(rows,128) * round_up(K/16,4)`` bytes: the
    contract's per-expert layout. The host checks K % 32 == 0 (16-byte TMA row pitch); state it."""
    ka = cute.assume(k, TMA_K_MULTIPLE)
    a = cute.make_tensor(a_ptr, cute.make_layout((m, ka, 1), stride=(ka, 1, cute.assume(m * k, TMA_K_MULTIPLE))))
    b = cute.make_tensor(b_ptr, cute.make_layout((nb, ka, lb), stride=(ka, 1, cute.assume(nb * k, TMA_K_MULTIPLE))))
    sfa = cute.make_tensor(sfa_ptr, blockscaled_utils.tile_atom_to_shape_SF(a.shape, SF_VEC))
    sfb = cute.make_tensor(sfb_ptr, blockscaled_utils.tile_atom_to_shape_SF(b.shape, SF_VEC))
    return a, b, sfa, sfb


class Nvfp4BlockScaledGemm:
    """Compile-time configuration; ``__call__`` is the ``@cute.jit`` host entry point."""

    def __init__(self, bn: int, *, swiglu: bool, grouped: bool):
        # N = 64 would need an SFB tile narrower than one 128-row scale atom (extra TMEM offset
        # logic); 128 and 256 keep every SFB tile a whole number of atoms.
        if bn not in (128, 256) or (swiglu and bn != 128):
            raise ValueError(f"tile N: expected 128 or 256 (128 with SwiGLU), found {bn}")
        self.bn = bn
        self.swiglu = swiglu
        self.grouped = grouped
        self.num_b = 2 if swiglu else 1
        self.mma_tiler = (TILE_M, bn, TILE_K)
        self.num_ab_stage = num_stages(bn, self.num_b)
        sfb_cols = (bn + 127) // 128 * 128 // 32 * (TILE_K // MMA_K)
        sfa_cols = TILE_M // 32 * (TILE_K // MMA_K)
        used = self.num_b * bn + sfa_cols + self.num_b * sfb_cols
        self.tmem_cols = 512 if used > 256 else 256  # allocation is a power of two >= 32

    @cute.jit
    def __call__(
        self,
        a_ptr: cute.Pointer,  # FP4 [M, K] K-major (packed u8, element 2k in the low nibble)
        b_ptr: cute.Pointer,  # FP4 [LB, NB, K] K-major
        sfa_ptr: cute.Pointer,  # E4M3, 32_4_4 swizzled [round_up(M,128) * round_up(K/16,4)]
        sfb_ptr: cute.Pointer,  # E4M3, swizzled per B batch
        c_ptr: cute.Pointer,  # BF16 [M, NB]
        alpha_ptr: cute.Pointer,  # FP32 [E] (dense: [1])
        sched_ptr: cute.Pointer,  # Int32 [W, 4] (expert, m_tile, row_lo, row_hi); unused when dense
        m: cutlass.Int32,
        nb: cutlass.Int32,  # rows per B batch = output columns
        k: cutlass.Int32,
        lb: cutlass.Int32,  # B batches (E, or 2E with SwiGLU)
        num_work: cutlass.Int32,  # grid x: schedule rows (grouped) or M tiles (dense)
        swiglu_limit: cutlass.Float32,
        stream,
    ):
        a, b, sfa, sfb = operand_views(a_ptr, b_ptr, sfa_ptr, sfb_ptr, m, nb, k, lb)
        c = cute.make_tensor(c_ptr, cute.make_layout((m, nb), stride=(nb, 1)))
        alpha = cute.make_tensor(alpha_ptr, cute.make_layout(lb // self.num_b))
        sched = cute.make_tensor(sched_ptr, cute.make_layout((num_work, 4), stride=(4, 1)))

        tiled_mma = sm100_utils.make_blockscaled_trivial_tiled_mma(
            AB_DTYPE, AB_DTYPE, OperandMajorMode.K, OperandMajorMode.K, SF_DTYPE, SF_VEC,
            tcgen05.CtaGroup.ONE, self.mma_tiler[:2])
        cluster_vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,))

        a_smem = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, AB_DTYPE, self.num_ab_stage)
        b_smem = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, AB_DTYPE, self.num_ab_stage)
        sfa_smem = blockscaled_utils.make_smem_layout_sfa(tiled_mma, self.mma_tiler, SF_VEC, self.num_ab_stage)
        sfb_smem = blockscaled_utils.make_smem_layout_sfb(tiled_mma, self.mma_tiler, SF_VEC, self.num_ab_stage)

        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        a_smem_1 = cute.slice_(a_smem, (None, None, None, 0))
        b_smem_1 = cute.slice_(b_smem, (None, None, None, 0))
        sfa_smem_1 = cute.slice_(sfa_smem, (None, None, None, 0))
        sfb_smem_1 = cute.slice_(sfb_smem, (None, None, None, 0))
        tma_a, tma_ta = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, a, a_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape)
        tma_b, tma_tb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, b, b_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape)
        # Scale tiles are moved as 16-bit elements (the 16-wide K vector of the atom has stride 0).
        tma_sfa, tma_tsfa = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, sfa, sfa_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape, internal_type=cutlass.Int16)
        tma_sfb, tma_tsfb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, sfb, sfb_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape, internal_type=cutlass.Int16)

        tx_bytes = (cute.size_in_bytes(AB_DTYPE, a_smem_1) + cute.size_in_bytes(SF_DTYPE, sfa_smem_1)
                    + self.num_b * (cute.size_in_bytes(AB_DTYPE, b_smem_1)
                                    + cute.size_in_bytes(SF_DTYPE, sfb_smem_1)))

        grid = (num_work, cute.ceil_div(nb, self.bn), 1)
        self.kernel(tiled_mma, tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb,
                    c, alpha, sched, a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes, m,
                    swiglu_limit).launch(grid=grid, block=[THREADS, 1, 1], cluster=(1, 1, 1),
                                         stream=stream)

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tma_a: cute.CopyAtom,
        mA: cute.Tensor,
        tma_b: cute.CopyAtom,
        mB: cute.Tensor,
        tma_sfa: cute.CopyAtom,
        mSFA: cute.Tensor,
        tma_sfb: cute.CopyAtom,
        mSFB: cute.Tensor,
        mC: cute.Tensor,
        alpha: cute.Tensor,
        sched: cute.Tensor,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        sfa_smem: cute.Layout,
        sfb_smem: cute.Layout,
        tx_bytes: cutlass.Constexpr,
        m: cutlass.Int32,
        swiglu_limit: cutlass.Float32,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()

        # ---- which tile: (expert, m tile, valid rows) -------------------------------------------
        expert = cutlass.Int32(0)
        m_tile = bidx
        row_lo = cutlass.Int32(0)
        row_hi = m
        if cutlass.const_expr(self.grouped):
            expert = sched[bidx, 0]
            m_tile = sched[bidx, 1]
            row_lo = sched[bidx, 2]
            row_hi = sched[bidx, 3]
        n_tile = bidy
        lb0 = expert * self.num_b  # gate (or the only) B batch; up = lb0 + 1

        # ---- shared memory ----------------------------------------------------------------------
        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, self.num_ab_stage * 2]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, 2]
            tmem_holding_buf: cutlass.Int32

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sA = smem.allocate_tensor(AB_DTYPE, a_smem.outer, byte_alignment=128, swizzle=a_smem.inner)
        sB0 = smem.allocate_tensor(AB_DTYPE, b_smem.outer, byte_alignment=128, swizzle=b_smem.inner)
        sSFA = smem.allocate_tensor(SF_DTYPE, sfa_smem, byte_alignment=128)
        sSFB0 = smem.allocate_tensor(SF_DTYPE, sfb_smem, byte_alignment=128)
        sB1 = sB0
        sSFB1 = sSFB0
        if cutlass.const_expr(self.swiglu):
            sB1 = smem.allocate_tensor(AB_DTYPE, b_smem.outer, byte_alignment=128, swizzle=b_smem.inner)
            sSFB1 = smem.allocate_tensor(SF_DTYPE, sfb_smem, byte_alignment=128)

        thread1 = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        ab_producer, ab_consumer = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar.data_ptr(), num_stages=self.num_ab_stage,
            producer_group=thread1, consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=tx_bytes).make_participants()
        acc_producer, acc_consumer = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar.data_ptr(), num_stages=1, producer_group=thread1,
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, THREADS)).make_participants()

        # ---- global tiles and their TMA partitions ----------------------------------------------
        tile_mk = cute.slice_(self.mma_tiler, (None, 0, None))
        tile_nk = cute.slice_(self.mma_tiler, (0, None, None))
        gA = cute.local_tile(mA, tile_mk, (None, None, None))  # (bM, bK, RestM, RestK, RestL)
        gB = cute.local_tile(mB, tile_nk, (None, None, None))
        gSFA = cute.local_tile(mSFA, tile_mk, (None, None, None))
        gSFB = cute.local_tile(mSFB, tile_nk, (None, None, None))
        k_tiles = cute.size(gA, mode=[3])

        thr_mma = tiled_mma.get_slice(0)
        one = cute.make_layout(1)
        tAsA, tAgA = cpasync.tma_partition(tma_a, 0, one, cute.group_modes(sA, 0, 3),
                                           cute.group_modes(thr_mma.partition_A(gA), 0, 3))
        tBsB0, tBgB = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(sB0, 0, 3),
                                            cute.group_modes(thr_mma.partition_B(gB), 0, 3))
        tBsB1, _ = cpasync.tma_partition(tma_b, 0, one, cute.group_modes(sB1, 0, 3),
                                         cute.group_modes(thr_mma.partition_B(gB), 0, 3))
        tAsSFA, tAgSFA = cpasync.tma_partition(tma_sfa, 0, one, cute.group_modes(sSFA, 0, 3),
                                               cute.group_modes(thr_mma.partition_A(gSFA), 0, 3))
        tBsSFB0, tBgSFB = cpasync.tma_partition(tma_sfb, 0, one, cute.group_modes(sSFB0, 0, 3),
                                                cute.group_modes(thr_mma.partition_B(gSFB), 0, 3))
        tBsSFB1, _ = cpasync.tma_partition(tma_sfb, 0, one, cute.group_modes(sSFB1, 0, 3),
                                           cute.group_modes(thr_mma.partition_B(gSFB), 0, 3))
        tAsSFA, tAgSFA = cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA)
        tBsSFB0, tBsSFB1, tBgSFB = (cute.filter_zeros(tBsSFB0), cute.filter_zeros(tBsSFB1),
                                    cute.filter_zeros(tBgSFB))
        # ((atom_v, rest_v), RestK) for this CTA's tile
        tAgA = tAgA[(None, m_tile, None, 0)]
        tAgSFA = tAgSFA[(None, m_tile, None, 0)]
        tBgB0 = tBgB[(None, n_tile, None, lb0)]
        tBgSFB0 = tBgSFB[(None, n_tile, None, lb0)]
        tBgB1 = tBgB0
        tBgSFB1 = tBgSFB0
        if cutlass.const_expr(self.swiglu):
            tBgB1 = tBgB[(None, n_tile, None, lb0 + 1)]
            tBgSFB1 = tBgSFB[(None, n_tile, None, lb0 + 1)]

        # ---- MMA fragments, TMEM: [acc0 | acc1 | SFA | SFB0 | SFB1] ----------------------------
        tCrA = tiled_mma.make_fragment_A(sA)
        tCrB0 = tiled_mma.make_fragment_B(sB0)
        tCrB1 = tiled_mma.make_fragment_B(sB1)
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        acc_fake = tiled_mma.make_fragment_C(acc_shape)

        tmem_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=THREADS)
        tmem = cutlass.memory.TmemAllocator(storage.tmem_holding_buf.ptr, barrier_for_retrieve=tmem_bar)
        tmem.allocate(self.tmem_cols)
        tmem.wait_for_alloc()
        acc_base = tmem.retrieve_ptr(ACC_DTYPE)
        tAcc0 = cute.make_tensor(acc_base, acc_fake.layout)
        acc_cols = tcgen05.find_tmem_tensor_col_offset(tAcc0)
        tAcc1 = tAcc0
        sf_base = acc_base + acc_cols
        if cutlass.const_expr(self.swiglu):
            tAcc1 = cute.make_tensor(acc_base + acc_cols, acc_fake.layout)
            sf_base = acc_base + 2 * acc_cols

        tCtSFA = cute.make_tensor(
            cute.recast_ptr(sf_base, dtype=SF_DTYPE),
            blockscaled_utils.make_tmem_layout_sfa(tiled_mma, self.mma_tiler, SF_VEC,
                                                   cute.slice_(sfa_smem, (None, None, None, 0))))
        sfa_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFA)
        sfb_layout = blockscaled_utils.make_tmem_layout_sfb(tiled_mma, self.mma_tiler, SF_VEC,
                                                            cute.slice_(sfb_smem, (None, None, None, 0)))
        tCtSFB0 = cute.make_tensor(cute.recast_ptr(sf_base + sfa_cols, dtype=SF_DTYPE), sfb_layout)
        tCtSFB1 = tCtSFB0
        if cutlass.const_expr(self.swiglu):
            sfb_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFB0)
            tCtSFB1 = cute.make_tensor(cute.recast_ptr(sf_base + sfa_cols + sfb_cols, dtype=SF_DTYPE),
                                       sfb_layout)

        # SMEM -> TMEM copies of the scale factors (tcgen05.cp 4x32x128b)
        s2t_atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), SF_DTYPE)
        s2t_sfa, s2t_sfa_src, s2t_sfa_dst = self._s2t(s2t_atom, sSFA, tCtSFA)
        s2t_sfb0, s2t_sfb0_src, s2t_sfb0_dst = self._s2t(s2t_atom, sSFB0, tCtSFB0)
        s2t_sfb1, s2t_sfb1_src, s2t_sfb1_dst = self._s2t(s2t_atom, sSFB1, tCtSFB1)

        # ---- mainloop: warp 0 loads and multiplies ----------------------------------------------
        if warp_idx == 0:
            acc_empty = acc_producer.acquire_and_advance()
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            for _kt in cutlass.range(k_tiles, prefetch_stages=self.num_ab_stage - 2):
                ab_empty = ab_producer.acquire_and_advance()
                kc, si, bar = ab_empty.count, ab_empty.index, ab_empty.barrier
                cute.copy(tma_a, tAgA[(None, kc)], tAsA[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_sfa, tAgSFA[(None, kc)], tAsSFA[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_b, tBgB0[(None, kc)], tBsB0[(None, si)], tma_bar_ptr=bar)
                cute.copy(tma_sfb, tBgSFB0[(None, kc)], tBsSFB0[(None, si)], tma_bar_ptr=bar)
                if cutlass.const_expr(self.swiglu):
                    cute.copy(tma_b, tBgB1[(None, kc)], tBsB1[(None, si)], tma_bar_ptr=bar)
                    cute.copy(tma_sfb, tBgSFB1[(None, kc)], tBsSFB1[(None, si)], tma_bar_ptr=bar)

                ab_full = ab_consumer.wait_and_advance()
                st = (None, None, None, None, ab_full.index)
                cute.copy(s2t_sfa, s2t_sfa_src[st], s2t_sfa_dst)
                cute.copy(s2t_sfb0, s2t_sfb0_src[st], s2t_sfb0_dst)
                if cutlass.const_expr(self.swiglu):
                    cute.copy(s2t_sfb1, s2t_sfb1_src[st], s2t_sfb1_dst)
                for kb in cutlass.range(cute.size(tCrA, mode=[2]), unroll_full=True):
                    kcoord = (None, None, kb, ab_full.index)
                    sfk = (None, None, kb)
                    tiled_mma.set(tcgen05.Field.SFA, tCtSFA[sfk].iterator)
                    tiled_mma.set(tcgen05.Field.SFB, tCtSFB0[sfk].iterator)
                    cute.gemm(tiled_mma, tAcc0, tCrA[kcoord], tCrB0[kcoord], tAcc0)
                    if cutlass.const_expr(self.swiglu):
                        tiled_mma.set(tcgen05.Field.SFB, tCtSFB1[sfk].iterator)
                        cute.gemm(tiled_mma, tAcc1, tCrA[kcoord], tCrB1[kcoord], tAcc1)
                    tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                ab_full.release()
            acc_empty.commit()

        # ---- epilogue: all warps, TMEM -> registers -> alpha (-> SwiGLU) -> BF16 -> global ------
        tmem.relinquish_alloc_permit()
        self._epilogue(tidx, tiled_mma, tAcc0, tAcc1, mC, alpha[expert], m_tile, n_tile, row_lo,
                       row_hi, swiglu_limit, acc_consumer)
        cute.arch.barrier()
        tmem.free(acc_base)

    @cute.jit
    def _s2t(self, atom, sSF: cute.Tensor, tSF: cute.Tensor):
        src = cute.filter_zeros(sSF)
        dst = cute.filter_zeros(tSF)
        tiled = tcgen05.make_s2t_copy(atom, dst)
        thr = tiled.get_slice(0)
        src_desc = tcgen05.get_s2t_smem_desc_tensor(tiled, thr.partition_S(src))
        return tiled, src_desc, thr.partition_D(dst)

    @cute.jit
    def _epilogue(self, tidx, tiled_mma, tAcc0, tAcc1, mC, alpha_e, m_tile, n_tile, row_lo,
                  row_hi, limit, acc_consumer):
        epi_tile = (TILE_M, EPI_N)
        tile_mn = cute.slice_(self.mma_tiler, (None, None, 0))
        thr_mma = tiled_mma.get_slice(0)
        gC = cute.local_tile(mC, tile_mn, (m_tile, n_tile))
        cC = cute.local_tile(cute.make_identity_tensor(mC.shape), tile_mn, (m_tile, n_tile))
        tCgC = cute.flat_divide(thr_mma.partition_C(gC)[((None, None), 0, 0)], epi_tile)
        tCcC = cute.flat_divide(thr_mma.partition_C(cC)[((None, None), 0, 0)], epi_tile)
        acc0_epi = cute.flat_divide(tAcc0[((None, None), 0, 0)], epi_tile)
        acc1_epi = cute.flat_divide(tAcc1[((None, None), 0, 0)], epi_tile)

        t2r_atom = cute.make_copy_atom(tcgen05.Ld32x32bOp(tcgen05.Repetition.x32, tcgen05.Pack.NONE),
                                       ACC_DTYPE)
        t2r = tcgen05.make_tmem_copy(t2r_atom, acc0_epi[(None, None, 0, 0)])
        thr = t2r.get_slice(tidx)
        tTR_t0 = thr.partition_S(acc0_epi)  # (T2R, T2R_M, T2R_N, EPI_M, EPI_N)
        tTR_t1 = thr.partition_S(acc1_epi)
        tTR_g = thr.partition_D(tCgC)
        tTR_c = thr.partition_D(tCcC)
        r0 = cute.make_rmem_tensor(tTR_g[(None, None, None, 0, 0)].shape, ACC_DTYPE)
        r1 = cute.make_rmem_tensor(tTR_g[(None, None, None, 0, 0)].shape, ACC_DTYPE)
        rC = cute.make_rmem_tensor(tTR_g[(None, None, None, 0, 0)].shape, C_DTYPE)
        n_cols = mC.shape[1]

        acc_full = acc_consumer.wait_and_advance()
        for chunk in cutlass.range_constexpr(cute.size(tTR_t0, mode=[4])):  # EPI_N columns each
            cute.copy(t2r, tTR_t0[(None, None, None, 0, chunk)], r0)
            v = r0.load() * alpha_e
            if cutlass.const_expr(self.swiglu):
                cute.copy(t2r, tTR_t1[(None, None, None, 0, chunk)], r1)
                u = r1.load() * alpha_e
                g = cute.where(v > limit, cute.full_like(v, limit), v)
                u = cute.where(u > limit, cute.full_like(u, limit), u)
                u = cute.where(u < -limit, cute.full_like(u, -limit), u)
                # silu(g) = g * sigmoid(g), the sigmoid of the CLAMPED gate (contract.GemmRequest)
                v = g / (1.0 + cute.math.exp(-g, fastmath=False)) * u
            rC.store(v.to(C_DTYPE))
            gch = tTR_g[(None, None, None, 0, chunk)]
            cch = tTR_c[(None, None, None, 0, chunk)]
            for i in cutlass.range_constexpr(cute.size(rC)):
                row, col = cch[i]
                if row >= row_lo and row < row_hi and col < n_cols:
                    gch[i] = rC[i]
        # tcgen05.wait::ld: every TMEM read of this thread has completed before the accumulator
        # is released and the TMEM freed.
        cute.arch.fence_view_async_tmem_load()
        acc_full.release()
