"""The grouped kernel's work schedule built on the device, with no host read of the offsets (so a
grouped GEMM can be captured in a CUDA graph and replayed with other routings).

``layout.grouped_schedule`` lists, on the host, every 128-row tile of A each non-empty expert owns a
row of. Here the same rows, in the same order, come from a few tensor ops on the device, into a
schedule of a length fixed by the problem's size alone:

    W_max = ceil(M / 128) + min(E, M) - 1

(non-empty experts are at most ``min(E, M)``; each owns the tiles its rows span, and consecutive
experts share at most one tile, so the tiles owned sum to at most ``ceil(M/128) + experts - 1``).
The rows past the real ones are ``(0, 0, 0, 0)``: tile 0 of expert 0 with no rows, which the kernel
computes and stores nothing of (its epilogue stores rows ``row_lo <= row < row_hi`` only). Each padding
row costs one tile's compute: none when the bound is met, at most ``min(E, M) - 1`` (every row routed to
one expert). Not timed on a B200: the host schedule it replaces had no padding but a host read per call.
"""
from __future__ import annotations

import torch

from .layout import TILE_M


def max_work(m: int, experts: int, tile_m: int = TILE_M) -> int:
    """The schedule's fixed length for ``m`` rows over ``experts`` experts (0 when there are no rows)."""
    if m <= 0 or experts <= 0:
        return 0
    return -(-m // tile_m) + min(experts, m) - 1


def device_grouped_schedule(offsets: torch.Tensor, m: int, tile_m: int = TILE_M) -> torch.Tensor:
    """int32 ``[max_work(m, E), 4]`` rows ``(expert, m_tile, row_lo, row_hi)`` on ``offsets``' device:
    ``layout.grouped_schedule``'s rows first, in its order, then ``(0, 0, 0, 0)`` padding. ``offsets``
    are the ``E + 1`` non-decreasing row offsets ending at ``m`` (validated by the request, not here:
    reading them would be the host sync this avoids)."""
    experts = offsets.numel() - 1
    w = max_work(m, experts, tile_m)
    dev = offsets.device
    if w == 0:
        return torch.zeros(0, 4, dtype=torch.int32, device=dev)
    off = offsets.to(torch.int64)
    lo, hi = off[:-1], off[1:]
    first = torch.div(lo, tile_m, rounding_mode="floor")
    last = torch.div(hi + tile_m - 1, tile_m, rounding_mode="floor")
    count = torch.where(hi > lo, last - first, torch.zeros_like(lo))
    ends = torch.cumsum(count, 0)                   # inclusive: expert e's work is [ends[e]-count[e], ends[e])
    slot = torch.arange(w, device=dev, dtype=torch.int64)
    e = torch.searchsorted(ends, slot, right=True).clamp_(max=experts - 1)
    valid = slot < ends[-1]
    m_tile = first[e] + (slot - (ends[e] - count[e]))
    rows = torch.stack([e, m_tile, lo[e], hi[e]], dim=1)
    return torch.where(valid[:, None], rows, torch.zeros_like(rows)).to(torch.int32)


__all__ = ["device_grouped_schedule", "max_work"]
