"""Run the kernel's own scale-factor view on the CPU (host-only ``@cute.jit``; spec §1.4).

``kernel_scale_view(flat, rows, k, batches)`` builds the SFB tensor exactly as the kernel does
(``kernel.operand_views``) over a CPU byte buffer and reads scale ``(row, 16*s, batch)`` for every
row, scale column and batch: the bytes the kernel's TMA tiles will carry for that block. Tests
compare the result with the oracle's linear scales, which ties the kernel's layout code (not a
re-derivation of it) to the contract's swizzled bytes.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

from ...contract import FP4_BLOCK
from .kernel import operand_views


@cute.jit
def _gather(src: cute.Tensor, dst: cute.Tensor, rows: cutlass.Int32, k: cutlass.Int32,
            batches: cutlass.Int32):
    # A-side arguments are unused here: pass the B view's rows/batches through the B slots.
    _, _, _, sf = operand_views(src.iterator, src.iterator, src.iterator, src.iterator, rows, rows, k,
                                batches)
    for l in cutlass.range(batches):
        for r in cutlass.range(rows):
            for s in cutlass.range(k // FP4_BLOCK):
                dst[l, r, s] = sf[(r, s * FP4_BLOCK, l)]


def kernel_scale_view(flat: torch.Tensor, rows: int, k: int, batches: int = 1) -> torch.Tensor:
    """Flat swizzled scale bytes (CPU) -> ``uint8 [batches, rows, K/16]`` as the kernel sees them."""
    src = flat.detach().to("cpu").contiguous().view(torch.uint8)
    dst = torch.zeros(batches, rows, k // FP4_BLOCK, dtype=torch.uint8)
    _gather(from_dlpack(src), from_dlpack(dst), rows, k, batches)
    return dst
