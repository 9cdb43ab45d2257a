"""Host-side layout math of the sm_100a kernels: pure torch, no ``cutlass`` import, device-agnostic.

* Scales to the 32_4_4 layout at the edge (spec §3.6; ``common.swizzle_linear_scales``) and back.
* The SwiGLU view of B: rows ``[gate; up]`` become two B batches (``2e`` gate, ``2e + 1`` up) of
  ``n/2`` rows. The packed FP4 bytes always allow this as a view; the swizzled scales do only when
  ``n/2`` is a multiple of 128 (each half is then a whole number of 128-row scale tiles), otherwise
  they are repacked half by half (``weight_scale_view``: B's scales as the kernels' batches).
* The grouped work schedule: one row ``(expert, m_tile, row_lo, row_hi)`` per (expert, 128-row tile
  of A) pair that intersects. Tiles follow the global 128-row grid of A so that SFA tiles are whole
  swizzle atoms of the contract's layout; a tile shared by two experts is computed once per expert
  and each keeps only its own rows.
* The tile-N choice and the TMA constraints the host wrapper checks before launch.

These constants are the kernel's (``kernel.py`` imports them), so the host math and the kernel
cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...contract import FP4_BLOCK, FP4Operand, round_up
from ..common import swizzle_linear_scales

TILE_M = 128  # rows of one cta_group::1 block-scaled MMA (and of one scale swizzle tile)
TILE_K = 256  # K elements per pipeline stage (128 bytes of FP4 per row)
SF_TILE_ROWS = 128
SF_TILE_COLS = 4
TMA_K_MULTIPLE = 32  # a TMA row pitch must be a multiple of 16 bytes: K/2 % 16 == 0
TMA_ALIGN_BYTES = 16  # TMA global base addresses


def unswizzle_32_4_4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Flat 32_4_4 bytes (see ``common.swizzle_linear_scales``) -> ``[rows, cols]`` (same dtype), padding
    dropped: element (row, col), ``row = 128 mt + 32 r1 + r0``, ``col = 4 kt + c``, lives at
    ``((mt*S_pad/4 + kt)*32 + r0)*16 + r1*4 + c``."""
    rp, cp = round_up(rows, SF_TILE_ROWS), round_up(cols, SF_TILE_COLS)
    if flat.numel() != rp * cp:
        raise ValueError(f"swizzled scales: expected {rp * cp} bytes for [{rows}, {cols}], found {flat.numel()}")
    t = flat.view(torch.uint8).reshape(rp // 128, cp // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return t.reshape(rp, cp)[:rows, :cols].contiguous().view(flat.dtype)


def swizzled_scales(scales: torch.Tensor, layout: str, rows: int, k: int, groups: int = 1) -> torch.Tensor:
    """The operand's scales as flat swizzled bytes, ``groups`` matrices of ``rows/groups`` rows each,
    swizzled independently (the contract's per-expert layout). Swizzled input is returned as is;
    linear input is converted here, at the edge (a per-call cost: swizzle weights at load time)."""
    if layout == "swizzled":
        return scales
    return swizzle_linear_scales(scales.reshape(rows, k // FP4_BLOCK), groups)


def swiglu_half_scales(flat: torch.Tensor, experts: int, n: int, k: int) -> torch.Tensor:
    """Per-expert swizzled scales of ``[gate; up]`` (``n`` rows) -> ``2E`` swizzled batches of ``n/2``
    rows (gate of expert e = batch 2e, up = 2e + 1). A view when ``n/2 % 128 == 0``."""
    half, sc = n // 2, k // FP4_BLOCK
    if half % SF_TILE_ROWS == 0:
        return flat  # batch 2e+j starts at (2e+j) * half * S_pad, exactly where that half begins
    per_expert = flat.reshape(experts, -1)
    lin = torch.stack([unswizzle_32_4_4(per_expert[e], n, sc) for e in range(experts)])
    return swizzle_linear_scales(lin.reshape(2 * experts * half, sc), 2 * experts)


def grouped_schedule(offsets: list[int], tile_m: int = TILE_M) -> torch.Tensor:
    """int32 ``[W, 4]`` rows ``(expert, m_tile, row_lo, row_hi)``: every 128-row tile of A that
    expert ``e`` owns a row of. Empty experts contribute nothing; the rows of a tile partition
    ``[0, M)`` among the experts exactly once."""
    rows = []
    for e in range(len(offsets) - 1):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi == lo:  # an empty expert mid-tile would otherwise get a tile that stores nothing
            continue
        for mt in range(lo // tile_m, (hi + tile_m - 1) // tile_m):
            rows.append((e, mt, lo, hi))
    return torch.tensor(rows, dtype=torch.int32).view(-1, 4)


@dataclass(frozen=True)
class KernelConfig:
    """One compiled kernel: tile N, fused SwiGLU, grouped (schedule-driven) or dense."""

    bn: int
    swiglu: bool
    grouped: bool

    @property
    def tag(self) -> str:
        return f"{'grouped' if self.grouped else 'dense'}_{'swiglu' if self.swiglu else 'plain'}_n{self.bn}"


# Every configuration the backend can launch (and compile_for_check compiles).
CONFIGS = (
    KernelConfig(128, False, False),
    KernelConfig(256, False, False),
    KernelConfig(128, True, False),
    KernelConfig(128, False, True),
    KernelConfig(128, True, True),
)


def choose_config(m: int, nb: int, *, swiglu: bool, grouped: bool) -> KernelConfig:
    """Tile N: 256 only for large dense plain GEMMs (enough tiles to fill the GPU with half as many
    A reloads); 128 otherwise (decode-sized M gets twice the CTAs; SwiGLU holds two accumulators)."""
    wide = not swiglu and not grouped and m >= 1024 and nb >= 2048
    return KernelConfig(256 if wide else 128, swiglu, grouped)


def launch_problems(m: int, nb: int, k: int, tensors: dict[str, torch.Tensor]) -> list[str]:
    """What keeps the TMA descriptors from being built or the kernel's 32-bit index math from
    holding (empty when launchable)."""
    out = []
    if k % TMA_K_MULTIPLE:
        out.append(f"K: expected a multiple of {TMA_K_MULTIPLE} (FP4 rows of K/2 bytes need a 16-byte "
                   f"TMA pitch), found {k}")
    if m * nb >= 2**31:
        out.append(f"output elements M*N: expected < 2^31 (32-bit epilogue indexing), found {m}*{nb}")
    for name, t in tensors.items():
        if t.data_ptr() % TMA_ALIGN_BYTES:
            out.append(f"{name} data_ptr: expected {TMA_ALIGN_BYTES}-byte aligned, found "
                       f"{t.data_ptr()} (mod {TMA_ALIGN_BYTES} = {t.data_ptr() % TMA_ALIGN_BYTES})")
    return out


def weight_scale_view(b: FP4Operand, experts: int, swiglu: bool) -> tuple[torch.Tensor, int, int]:
    """(flat swizzled SFB for the kernel's batches, rows per batch, batch count)."""
    n = b.rows // experts
    if not swiglu:
        return swizzled_scales(b.scales, b.scale_layout, b.rows, b.k, experts), n, experts
    if b.scale_layout == "linear":  # the halves are contiguous row blocks: swizzle each one directly
        return swizzled_scales(b.scales, "linear", b.rows, b.k, 2 * experts), n // 2, 2 * experts
    return swiglu_half_scales(b.scales, experts, n, b.k), n // 2, 2 * experts
