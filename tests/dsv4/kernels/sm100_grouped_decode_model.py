"""Plain models of the sm_100a grouped decode GEMM's host contract, for its tests
(``test_sm100_grouped_decode.py``): the slot schedule as a loop, what a schedule and a gather must
satisfy, and a CPU model of what the two launches (gather, GEMM) compute from their arguments.
"""
from __future__ import annotations

import torch

from dsv4.kernels.contract import FP4Operand, GroupedGemmRequest
from dsv4.kernels.cutedsl.sm100.grouped_decode_launch import GroupedDecodeGemm100, token_tile
from dsv4.kernels.cutedsl.sm100.layout import unswizzle_32_4_4
from dsv4.kernels.cutedsl.sm100.token_tiles import (gather_token_tiles, slot_count, slot_scale_bytes,
                                                    slot_schedule)
from dsv4.numerics import e2m1_decode, e4m3_decode, unpack_nibbles


def schedule_loop(offsets: list[int], ntok: int, slots: int) -> list[list[int]]:
    """The plain formulation: each expert's rows in tiles of ``ntok``, in expert order, then empty slots."""
    rows = [[e, r, min(offsets[e + 1], r + ntok), 0]
            for e in range(len(offsets) - 1) for r in range(offsets[e], offsets[e + 1], ntok)]
    assert len(rows) <= slots, "more tiles than slots"
    return rows + [[0, 0, 0, 0]] * (slots - len(rows))


def check_schedule(sched: torch.Tensor, offsets: list[int], ntok: int) -> None:
    """What the GEMM needs of a schedule: every row stored once, by a slot of its own expert, <= ntok
    rows a slot; empty slots are (0, 0, 0)."""
    owner = [-1] * offsets[-1]
    for e, lo, hi, pad in sched.tolist():
        assert pad == 0 and lo <= hi <= lo + ntok, (e, lo, hi)
        if lo == hi:
            assert (e, lo) == (0, 0), "an empty slot names no expert"
            continue
        assert offsets[e] <= lo and hi <= offsets[e + 1], f"slot rows {lo}:{hi} outside expert {e}"
        for r in range(lo, hi):
            assert owner[r] == -1, f"row {r} stored twice"
            owner[r] = e
    assert -1 not in owner, "a row never stored"


def random_offsets(gen: torch.Generator, experts: int, rows: int) -> list[int]:
    counts = torch.bincount(torch.randint(0, experts, (rows,), generator=gen), minlength=experts)
    return [0] + torch.cumsum(counts, 0).tolist()


def swizzled_token_scales(a: FP4Operand) -> torch.Tensor:
    from dsv4.kernels.cutedsl.sm100.layout import swizzled_scales

    return swizzled_scales(a.scales, a.scale_layout, a.rows, a.k)


def linear_scales(a: FP4Operand) -> torch.Tensor:
    return a.scales if a.scale_layout == "linear" else unswizzle_32_4_4(a.scales, a.rows, a.k // 16)


def check_gather(a: FP4Operand, sched, tiles, scales, ntok) -> None:
    """Slot s's packed rows and scales (through the kernel's own SF view) are its tokens', zero past them;
    the 128 - ntok padding rows of its scale atom are zero."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    slots, k = sched.shape[0], a.k
    assert tiles.shape == (slots * ntok, k // 2) and scales.numel() == slots * slot_scale_bytes(k)
    seen = kernel_scale_view(scales, ntok, k, batches=slots)
    lin = linear_scales(a).view(torch.uint8)
    for s, (_, lo, hi, _) in enumerate(sched.tolist()):
        n = hi - lo
        assert torch.equal(tiles[s * ntok:s * ntok + n], a.packed[lo:hi]), f"slot {s} packed rows"
        assert not tiles[s * ntok + n:(s + 1) * ntok].any(), f"slot {s} rows past its tokens"
        assert torch.equal(seen[s, :n], lin[lo:hi]), f"slot {s} scales"
        assert not seen[s, n:].any()
        atom = scales[s * slot_scale_bytes(k):(s + 1) * slot_scale_bytes(k)]
        assert not unswizzle_32_4_4(atom, 128, k // 16).view(torch.uint8)[ntok:].any(), "padding rows"


def grouped_decode_model(req: GroupedGemmRequest) -> torch.Tensor:
    """What the gather and the GEMM compute from the launch arguments: the slots' gathered tokens and
    the experts' weight batches (both read through the kernel's scale view), FP32 accumulator times
    a.global * b.global[e], optional SwiGLU, BF16, stored to the slot's rows; every row exactly once."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    a, b, e, k = req.a, req.b, req.num_experts, req.a.k
    wsf, xsf, n_out, lb = GroupedDecodeGemm100("cpu").prepare(req)
    ntok = token_tile(a.rows, e)
    sched = slot_schedule(req.offsets, ntok, slot_count(a.rows, e, ntok))
    tiles, scales = gather_token_tiles(a.packed, xsf, sched, ntok, k)
    tok = e2m1_decode(unpack_nibbles(tiles)).double().view(-1, ntok, k) * e4m3_decode(
        kernel_scale_view(scales, ntok, k, sched.shape[0])).double().repeat_interleave(16, 2)
    w = e2m1_decode(unpack_nibbles(b.packed.view(lb, n_out, k // 2))).double() * e4m3_decode(
        kernel_scale_view(wsf, n_out, k, lb)).double().repeat_interleave(16, 2)
    out = torch.zeros(req.out_shape, dtype=torch.bfloat16)
    stores = torch.zeros(a.rows, dtype=torch.int32)
    num_a = lb // e
    for s, (ex, lo, hi, _) in enumerate(sched.tolist()):
        if lo == hi:
            continue
        alpha = a.global_scale * b.global_scale[ex]
        v = (w[ex * num_a] @ tok[s].T).float() * alpha  # [n_out, ntok]: swap-AB
        if req.swiglu_limit is not None:
            lim = req.swiglu_limit
            g = v.clamp(max=lim)
            u = ((w[ex * num_a + 1] @ tok[s].T).float() * alpha).clamp(-lim, lim)
            v = g / (1 + torch.exp(-g)) * u
        out[lo:hi] = v.T[:hi - lo].to(torch.bfloat16)
        stores[lo:hi] += 1
    assert torch.all(stores == 1), "every output row is stored exactly once"
    return out
