"""Decode / streaming state (spec §6 "Decode / streaming state", §8): per layer a window KV ring,
the compressed entries, the indexer keys and the rows of compressor blocks that have not closed."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class CompressorState:
    """One compressor's memory (§6). Rows are fp32 projections C and gate logits Z + B (ape added).

    ``pend_*``: tokens of the open block (fewer than m); ``prev_*``: the last closed block, kept by
    overlapping (CSA) compressors because entry j also pools block j−1; ``entries``: emitted entries
    as the attention / scoring reads them (after the profile's fake quantization)."""

    pend_c: torch.Tensor | None = None
    pend_z: torch.Tensor | None = None
    prev_c: torch.Tensor | None = None
    prev_z: torch.Tensor | None = None
    entries: torch.Tensor | None = None

    @property
    def n_entries(self) -> int:
        return 0 if self.entries is None else self.entries.shape[0]

    @property
    def n_pending(self) -> int:
        return 0 if self.pend_c is None else self.pend_c.shape[0]


@dataclass
class LayerCache:
    """``pos``: tokens this layer has consumed. ``ring``: raw window kv rows (after kv_norm, RoPE and
    the profile's FP8), position p in slot p mod W (§8 decode)."""

    pos: int = 0
    ring: torch.Tensor | None = None
    compressor: CompressorState | None = None
    indexer: CompressorState | None = None


@dataclass
class ReferenceState:
    """The tokens of the current call (``ids``, starting at absolute position ``start``) and every
    layer's cache. ``pos`` = tokens seen once this call has gone through the model."""

    ids: torch.Tensor
    start: int
    layers: list[LayerCache] = field(default_factory=list)

    @property
    def pos(self) -> int:
        return self.start + int(self.ids.shape[0])

    def positions(self, device: torch.device | str) -> torch.Tensor:
        return torch.arange(self.start, self.pos, device=device)
