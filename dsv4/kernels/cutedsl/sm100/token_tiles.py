"""Token tiles of the sm_100a grouped decode GEMM: which rows each slot (grid.z) takes, and the
per-slot padded tiles those rows are gathered into. Pure torch, no ``cutlass``: the specification
``token_gather_kernel.py`` implements on the device (CPU tests run these functions; B200 tests compare
the kernel with them bit for bit).

* ``slot_count``: a bound on the token tiles of any routing of ``rows`` rows over ``experts`` groups,
  from shapes alone (no host read of the offsets): ``sum_e ceil(m_e / t) <= rows // t + min(E, rows)``.
* ``slot_schedule``: slot ``s`` -> ``(expert, row_lo, row_hi, 0)``, the experts' token tiles of ``t``
  rows in expert order; slots past the last tile are empty (``row_lo == row_hi == 0``).
* ``gather_token_tiles``: slot ``s``'s rows as batch ``s`` of packed ``[slots * t, K/2]`` FP4 and of
  swizzled scales with one 128-row 32_4_4 atom per slot (the layout the dense decode kernel's token TMA
  reads for batch 0). Rows past ``row_hi - row_lo`` and the atom's padding rows are zero.

Every step is a device-side torch op on the offsets' device: no host read, CUDA-graph capturable.
"""
from __future__ import annotations

import torch

from ...contract import FP4_BLOCK, round_up
from ..scale_offsets import swizzled_scale_offset
from .layout import SF_TILE_COLS, SF_TILE_ROWS

SCHED_COLS = 4  # (expert, row_lo, row_hi, 0): a 16-byte row per slot


def slot_count(rows: int, experts: int, ntok: int) -> int:
    """Token-tile slots that cover any routing of ``rows`` rows over ``experts`` groups."""
    return rows // ntok + min(experts, rows)


def slot_schedule(offsets: torch.Tensor, ntok: int, slots: int) -> torch.Tensor:
    """int32 ``[slots, 4]``: ``(expert, row_lo, row_hi, 0)`` per slot (see the module docstring)."""
    off = offsets.to(torch.int64)
    experts = off.numel() - 1
    tiles = (off[1:] - off[:-1] + ntok - 1) // ntok        # token tiles per expert (0 when empty)
    ends = torch.cumsum(tiles, 0)                           # slots used by experts 0..e
    s = torch.arange(slots, device=off.device)
    e = torch.searchsorted(ends, s, right=True)             # first expert whose tiles reach past s
    used = e < experts
    e = e.clamp(max=experts - 1)
    lo = off[e] + (s - (ends[e] - tiles[e])) * ntok
    hi = torch.minimum(off[e + 1], lo + ntok)
    zero = torch.zeros_like(s)
    return torch.stack([torch.where(used, e, zero), torch.where(used, lo, zero),
                        torch.where(used, hi, zero), zero], 1).to(torch.int32)


def slot_scale_bytes(k: int) -> int:
    """Bytes of one slot's token scales: one 128-row 32_4_4 atom over round_up(K/16, 4) columns."""
    return SF_TILE_ROWS * round_up(k // FP4_BLOCK, SF_TILE_COLS)


def gather_token_tiles(packed: torch.Tensor, scales: torch.Tensor, sched: torch.Tensor, ntok: int,
                       k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 ``[slots * ntok, K/2]``, float8_e4m3fn ``[slots * slot_scale_bytes(K)]``): the tokens of
    every slot of ``sched``, from ``packed`` ``[rows, K/2]`` and ``scales`` (flat 32_4_4 of ``rows``)."""
    slots, sc = sched.shape[0], k // FP4_BLOCK
    sc_pad = round_up(sc, SF_TILE_COLS)
    dev = packed.device
    i = torch.arange(ntok, device=dev)
    row = sched[:, 1:2].to(torch.int64) + i                 # [slots, ntok] source rows
    valid = row < sched[:, 2:3]
    src = torch.where(valid, row, torch.zeros_like(row))    # row 0 stands in for the rows not taken
    tok = torch.where(valid[..., None], packed[src], torch.zeros((), dtype=packed.dtype, device=dev))
    # scales: every byte of each slot's atom, taken from its row's byte (rows past the slot's tokens
    # and the 128 - ntok padding rows: zero)
    r = torch.arange(SF_TILE_ROWS, device=dev)
    c = torch.arange(sc_pad, device=dev)
    dst = swizzled_scale_offset(r[:, None], c[None, :], sc_pad)          # [128, sc_pad] in one atom
    srow = sched[:, 1:2].to(torch.int64) + r                             # [slots, 128]
    take = (r < ntok) & (srow < sched[:, 2:3])
    src_b = swizzled_scale_offset(torch.where(take, srow, 0)[..., None], c, sc_pad)
    flat = scales.reshape(-1).view(torch.uint8)
    vals = torch.where(take[..., None], flat[src_b], torch.zeros((), dtype=torch.uint8, device=dev))
    out = torch.empty(slots, SF_TILE_ROWS * sc_pad, dtype=torch.uint8, device=dev)
    out[:, dst.reshape(-1)] = vals.reshape(slots, -1)
    return tok.reshape(slots * ntok, k // 2), out.reshape(-1).view(torch.float8_e4m3fn)
