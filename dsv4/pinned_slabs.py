"""Pinned host memory for the probes' asynchronous copies, carved out of a few large slabs.

torch's pinned-memory allocator rounds every block up to the next power of two (``host_memory_stats``
documents it) and keeps freed blocks cached, so one pinned tensor per probe would hold up to twice
the probes' bytes (about 1.4x for sizes spread evenly) in page-locked memory that cannot be swapped.
Here slabs are powers of two, so the allocator rounds nothing: tensors are bump-allocated inside
them (64-byte aligned). A slab is twice the size of the one before (from 1 MiB up to 256 MiB, and at
least the tensor that opened it, rounded up to a power of two), so a small model pins about what its
probes need and a large one wastes at most the tails of its slabs. A tensor above ``MAX_SLAB`` gets
no slab (``None``): the caller copies it another way. A slab lives as long as any tensor cut from it.
"""
from __future__ import annotations

from typing import Any, Callable

MIN_SLAB = 1 << 20
MAX_SLAB = 1 << 28
ALIGN = 64


def _pinned_bytes(n: int) -> Any:
    import torch

    return torch.empty(n, dtype=torch.uint8, pin_memory=True)


class PinnedSlabs:
    """``empty(shape, dtype)``: an uninitialized host tensor inside a pinned slab, or None when it
    is larger than ``MAX_SLAB``. ``alloc(n)`` makes an n-byte uint8 slab (pinned by default)."""

    def __init__(self, alloc: Callable[[int], Any] | None = None) -> None:
        self._alloc = alloc or _pinned_bytes
        self._slab: Any = None
        self._off = 0
        self._next = MIN_SLAB
        self.reserved = 0      # bytes of every slab opened
        self.used = 0          # bytes handed out

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        n = dtype.itemsize
        for s in shape:
            n *= int(s)
        if n > MAX_SLAB:
            return None
        need = -(-n // ALIGN) * ALIGN
        if self._slab is None or self._off + need > int(self._slab.numel()):
            size = max(self._next, 1 << max(need - 1, 0).bit_length())
            self._slab, self._off = self._alloc(size), 0
            self.reserved += size
            self._next = min(2 * size, MAX_SLAB)
        out = self._slab[self._off:self._off + n]
        self._off += need
        self.used += n
        return out.view(dtype).view(tuple(shape))
