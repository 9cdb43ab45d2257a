"""Lightning indexer (spec §7, CSA layers only): picks, per query, the top-k compressed entries it
may attend to among the causally visible ones."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4 import probes

from .compressor import Compressor
from .fakequant import fake_quant_fp4, hadamard
from .ops import ACC, linear
from .rope import RopeSpec, apply_rope, cos_sin
from .state import CompressorState


@dataclass(frozen=True)
class IndexerWeights:
    wq_b: torch.Tensor           # [Hi·di, q_lora]
    weights_proj: torch.Tensor   # [Hi, D]


def visible_entries(positions: torch.Tensor, ratio: int) -> torch.Tensor:
    """§6 causality: a query at t sees the entries j < ⌊(t+1)/m⌋ (blocks closed at or before t)."""
    return torch.div(positions + 1, ratio, rounding_mode="floor")


def index_scores(q: torch.Tensor, keys: torch.Tensor, wts: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """§7 step 6: I(t, j) = Σ_h w_{t,h} · ReLU(q_{t,h} · K_j) in fp32, queries in chunks so the
    [chunk, Hi, N] intermediate stays bounded on long prompts."""
    kd, wd = keys.to(ACC), wts.to(ACC)
    out = [(torch.einsum("thd,nd->thn", q[a:a + chunk].to(ACC), kd).relu() * wd[a:a + chunk].unsqueeze(-1)).sum(1)
           for a in range(0, q.shape[0], chunk)]
    return torch.cat(out).float()


def select_topk(scores: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    """§7 step 7: top-k of the masked scores; picks that are not visible become −1. Scores already
    hold −inf on invisible entries, so every finite score outranks them.

    Ties (frequent: ReLU makes a score exactly 0 whenever every head's q·k is negative) go to the
    lower entry index, so the choice does not depend on how many entries exist yet (decode == prefill);
    the spec leaves tie order open (torch.topk's is unspecified)."""
    idx = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.where(idx >= visible.unsqueeze(-1), torch.full_like(idx, -1), idx)


def sorted_topk(idx: torch.Tensor) -> torch.Tensor:
    """Probe layout: ids ascending per row, −1 last."""
    big = torch.iinfo(idx.dtype).max
    s = torch.sort(torch.where(idx < 0, big, idx), dim=-1).values
    return s.masked_fill(s == big, -1)


class Indexer:
    """§7. ``__call__(x, q_lat, positions, state, layer)`` → top-k entry ids [T, k] (−1 invalid),
    k = min(index_topk, N) with N the entries available after this call's tokens."""

    def __init__(self, w: IndexerWeights, compressor: Compressor, *, n_heads: int, head_dim: int, topk: int,
                 ratio: int, rope: RopeSpec, fp4: bool, quant_wq_b: bool) -> None:
        self.w, self.compressor = w, compressor
        self.n_heads, self.head_dim, self.topk, self.ratio = n_heads, head_dim, topk, ratio
        self.rope, self.fp4, self.quant_wq_b = rope, fp4, quant_wq_b

    def _qat(self, t: torch.Tensor) -> torch.Tensor:
        """§7 step 3 / §12 row 4: Hadamard(di)/√di then FP4, in the official profile only."""
        return fake_quant_fp4(hadamard(t), 32) if self.fp4 else t

    def __call__(self, x: torch.Tensor, q_lat: torch.Tensor, positions: torch.Tensor, st: CompressorState,
                 layer: int) -> torch.Tensor:
        T = x.shape[0]
        # §7 steps 1-2: q from the q latent, no per-head norm, interleaved RoPE on the trailing dims.
        q = linear(q_lat, self.w.wq_b, self.quant_wq_b).view(T, self.n_heads, self.head_dim)
        q = apply_rope(q, cos_sin(self.rope, positions))
        probes.emit(f"layers.{layer}.attn.indexer.q", q)
        q = self._qat(q)
        # §7 step 4: keys from the indexer's own overlapping compressor (norm, RoPE at 4j, QAT).
        keys, _ = self.compressor(x, int(positions[0]), st)
        probes.emit(f"layers.{layer}.attn.indexer.k", keys)
        keys = self._qat(keys)
        st.entries = keys if st.entries is None else torch.cat((st.entries, keys))
        # §7 step 5: w_{t,h} = (weights_proj x_t)_h · di^-1/2 · Hi^-1/2 (constants from the indexer config).
        wts = linear(x, self.w.weights_proj).float() * (self.head_dim ** -0.5 * self.n_heads ** -0.5)
        scores = index_scores(q, st.entries, wts)
        # §7 step 7: causal mask, top-k with k = min(index_topk, N), invisible picks -> -1.
        visible = visible_entries(positions, self.ratio)
        n = st.entries.shape[0]
        scores = scores.masked_fill(torch.arange(n, device=x.device) >= visible.unsqueeze(-1), float("-inf"))
        probes.emit(f"layers.{layer}.attn.indexer.scores", scores)
        idx = select_topk(scores, visible, min(self.topk, n))
        if probes.active():
            probes.emit(f"layers.{layer}.attn.indexer.topk", sorted_topk(idx))
        return idx
