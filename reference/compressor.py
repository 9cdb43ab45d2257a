"""Compressor (spec §6): gated pooling of m-token blocks into one entry, for CSA (m = csa_ratio,
overlapping halves), HCA (m = hca_ratio) and the indexer's own CSA-style compressor.

One code path serves prefill, chunked prefill and decode: the rows of a block that has not closed
yet are kept in the state and completed by later tokens, so an entry is the same whichever way its
tokens arrive. Only complete blocks produce entries (causality rule j < ⌊(t+1)/m⌋, §6).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .ops import ACC, mm, rms_norm
from .rope import RopeSpec, apply_rope, cos_sin
from .state import CompressorState


@dataclass(frozen=True)
class CompressorWeights:
    wkv: torch.Tensor     # [κc, D]
    wgate: torch.Tensor   # [κc, D]
    ape: torch.Tensor     # [m, κc] fp32 position bias of the gate logits
    norm: torch.Tensor    # [c]


def project(x: torch.Tensor, w: CompressorWeights, positions: torch.Tensor, ratio: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """§6 step 1, in fp32 (§12): C_p = W_kv x_p and Z_p = W_gate x_p + B[p mod m].
    The position bias goes into the gate logits only, never into the content C."""
    c = mm(x, w.wkv.T).float()
    z = mm(x, w.wgate.T).float() + w.ape.float()[positions % ratio]
    return c, z


def pool(c: torch.Tensor, z: torch.Tensor, prev_c: torch.Tensor | None, prev_z: torch.Tensor | None,
         overlap: bool) -> torch.Tensor:
    """§6 steps 3-4. c, z: [nb, m, κc] complete blocks. HCA: per-channel softmax over the m rows.
    CSA: entry j pools block j−1 through its first half (a) and block j through its second half (b):
    2m slots per channel under one softmax. ``prev_*`` [m, 2c]: the block before the first one here
    (None at the start of the sequence: C = 0 and Z = −∞, zero weight)."""
    if overlap:
        half = c.shape[-1] // 2
        if prev_c is None:
            prev_c = torch.zeros_like(c[0])
            prev_z = torch.full_like(z[0], float("-inf"))
        before_c = torch.cat((prev_c.unsqueeze(0), c[:-1]), dim=0)[..., :half]
        before_z = torch.cat((prev_z.unsqueeze(0), z[:-1]), dim=0)[..., :half]
        c = torch.cat((before_c, c[..., half:]), dim=1)   # [nb, 2m, c]
        z = torch.cat((before_z, z[..., half:]), dim=1)
    return (c.to(ACC) * torch.softmax(z.to(ACC), dim=1)).sum(dim=1).float()


class Compressor:
    """§6 for one layer: ``__call__(x, start, state)`` consumes the tokens at positions
    start..start+T−1 and returns the entries whose blocks closed, after norm and RoPE at j·m
    (steps 5-6), in the activation dtype, with the index of the first one. Fake quantization (step 7)
    belongs to the caller, which also appends to ``state.entries``."""

    def __init__(self, w: CompressorWeights, ratio: int, overlap: bool, rope: RopeSpec, eps: float) -> None:
        self.w, self.ratio, self.overlap, self.rope, self.eps = w, ratio, overlap, rope, eps

    def __call__(self, x: torch.Tensor, start: int, st: CompressorState) -> tuple[torch.Tensor, int]:
        m = self.ratio
        positions = torch.arange(start, start + x.shape[0], device=x.device)
        c, z = project(x, self.w, positions, m)
        if st.pend_c is not None:
            c, z = torch.cat((st.pend_c, c)), torch.cat((st.pend_z, z))
        block0 = start - st.n_pending
        if block0 % m:
            raise RuntimeError(f"compressor state: open block starts at {block0}, not a multiple of m={m}")
        nb = c.shape[0] // m
        used = nb * m
        st.pend_c, st.pend_z = c[used:], z[used:]
        j0 = block0 // m
        if nb == 0:
            return x.new_zeros((0, self.w.norm.shape[0])), j0
        bc, bz = c[:used].view(nb, m, -1), z[:used].view(nb, m, -1)
        prev_c, prev_z = st.prev_c, st.prev_z
        if self.overlap and prev_c is None and j0 > 0:
            raise RuntimeError(f"compressor state: entry {j0} needs block {j0 - 1}, which was not kept")
        pooled = pool(bc, bz, prev_c, prev_z, self.overlap)
        if self.overlap:
            st.prev_c, st.prev_z = bc[-1], bz[-1]
        # §6 step 5: cast to the activation dtype, then the weighted norm; step 6: RoPE at j·m.
        entries = rms_norm(pooled.to(x.dtype), self.w.norm, self.eps)
        entry_pos = (j0 + torch.arange(nb, device=x.device)) * m
        return apply_rope(entries, cos_sin(self.rope, entry_pos)), j0
