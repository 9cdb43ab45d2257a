"""The Blackwell 32_4_4 scale-factor layout (tcgen05 / cuBLASLt VEC16_UE4M3 / torch SWIZZLE_32_4_4).

For a scale matrix ``[R, S]`` padded with zeros to ``[R_pad, S_pad] = [round_up(R,128), round_up(S,4)]``,
element ``(row, col)`` with ``row = 128*mt + 32*r1 + r0`` and ``col = 4*kt + c`` lives at

    offset = ((mt * (S_pad/4) + kt) * 32 + r0) * 16 + r1 * 4 + c

(spec nvfp4-and-kernels.md §3.6): 512-byte tiles of 128 rows x 4 columns, the K tile fastest, rows
0-31 interleaved with rows 32-63, 64-95 and 96-127 inside a tile.
"""
from __future__ import annotations

import torch

from ._checks import check_tensor, fail


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzled_numel(rows: int, scale_cols: int) -> int:
    return round_up(rows, 128) * round_up(scale_cols, 4)


def swizzle_scales(s: torch.Tensor) -> torch.Tensor:
    """``[..., R, S]`` -> ``[..., round_up(R,128) * round_up(S,4)]`` in the 32_4_4 layout (zero padding).

    A 2-D input gives the flat 1-D tensor kernels take; leading dims (e.g. experts) are kept, so a
    stack ``[E, R, S]`` becomes ``[E, n]`` (flatten it for a per-expert swizzled operand). Any dtype.
    """
    check_tensor(s, "swizzle_scales input")
    if s.dim() < 2:
        fail("swizzle_scales input shape", "[..., R, S]", list(s.shape))
    *lead, r, c = s.shape
    rp, cp = round_up(r, 128), round_up(c, 4)
    padded = torch.zeros((*lead, rp, cp), dtype=s.dtype, device=s.device)
    padded[..., :r, :c] = s
    nl = len(lead)
    # rows -> (mt, r1, r0), cols -> (kt, c); order the flat output as (mt, kt, r0, r1, c).
    t = padded.reshape(*lead, rp // 128, 4, 32, cp // 4, 4)
    t = t.permute(*range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4)
    return t.reshape(*lead, rp * cp)


def unswizzle_scales(flat: torch.Tensor, rows: int, scale_cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_scales`: ``[..., n]`` -> ``[..., rows, scale_cols]`` (padding dropped)."""
    check_tensor(flat, "unswizzle_scales input")
    rp, cp = round_up(rows, 128), round_up(scale_cols, 4)
    if rows <= 0 or scale_cols <= 0:
        fail("unswizzle_scales rows/scale_cols", "positive integers", (rows, scale_cols))
    if flat.dim() < 1 or flat.shape[-1] != rp * cp:
        fail("unswizzle_scales input shape", f"[..., {rp * cp}] (= round_up({rows},128) * round_up({scale_cols},4))",
             list(flat.shape))
    *lead, _ = flat.shape
    nl = len(lead)
    t = flat.reshape(*lead, rp // 128, cp // 4, 32, 4, 4)  # (mt, kt, r0, r1, c)
    t = t.permute(*range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4)  # (mt, r1, r0, kt, c)
    return t.reshape(*lead, rp, cp)[..., :rows, :scale_cols].contiguous()
