"""Normalized Walsh-Hadamard transform over the last dim (the indexer's rotation, spec §12)."""
from __future__ import annotations

import math

import torch

from ._checks import check_float, fail


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """``y = x @ H_n / sqrt(n)`` over the last dim, n a power of two, H in Sylvester order
    (``H_1 = [1]``, ``H_2n = [[H_n, H_n], [H_n, -H_n]]``; H is symmetric, so this is also ``H x``).

    Computed with the fast butterfly in float32 (float64 for float64 input), scaled at the end by
    ``n**-0.5`` rounded to that precision (as the official ``hadamard_transform(x, scale=n**-0.5)``
    call), and returned in ``x.dtype``. Rounding order differs from the CUDA kernel, so results agree
    to float32 rounding, not bit for bit.
    """
    check_float(x, "hadamard_transform x")
    if x.dim() == 0:
        fail("hadamard_transform x shape", "[..., n]", "a 0-d tensor")
    n = int(x.shape[-1])
    if n <= 0 or n & (n - 1):
        fail("hadamard_transform last dim", "a power of two", n)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(work).reshape(-1, n)
    h = 1
    while h < n:
        # pairs (i, i + h) inside every 2h chunk: [a; b] -> [a + b; a - b]
        t = y.reshape(-1, n // (2 * h), 2, h)
        a, b = t[:, :, 0, :], t[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, n)
        h *= 2
    scale = torch.full((), 1.0 / math.sqrt(n), dtype=work, device=x.device)   # no host-to-device copy
    return (y * scale).reshape(x.shape).to(x.dtype)
