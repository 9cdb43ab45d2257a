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
kernel's warp roles, ring and epilogue. The epilogue (``Sm100DecodeGemm._cta`` and its ``_epilogue``, shared) gets the
slot's output rows ``y[row_lo:row_hi]`` as its ``C``, ``alpha = a.global_scale * b.global_scale[e]``
(FP32: the contract's ``alphas[e]`` bit for bit) and the slot's own split-K workspace and tile counters
(``workspace + slot * tiles * splits * partial``, ``counters + slot * tiles``).
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32

from .decode_kernel import THREADS, Sm100DecodeGemm
from .kernel import operand_views
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

        tiled_mma, tiled_mma_sfb, atoms, smem, tx_bytes = self.operand_atoms(w, x, wsf, xsf)
        tma_a, tma_ta, tma_b, tma_tb, tma_sfa, tma_tsfa, tma_sfb, tma_tsfb = atoms
        a_smem, b_smem, sfa_smem, sfb_smem = smem

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
            self._cta(tiled_mma, tiled_mma_sfb, tma_a, mA, tma_b, mB, tma_sfa, mSFA, tma_sfb, mSFB, c,
                      alpha_a, alpha_b + expert, workspace + slot * partials, counters + slot * gx,
                      a_smem, b_smem, sfa_smem, sfb_smem, tx_bytes, tile, split, slot, expert * self.num_a,
                      splits, swiglu_limit)
