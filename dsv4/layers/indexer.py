"""Lightning indexer (spec §7): picks, per query, ``index_topk`` compressed entries of a CSA layer.

``q = wq_b(q_lat)`` (no per-head norm), RoPE on the trailing dims (interleaved; never the V3.2
layout), keys from the indexer's own overlapping compressor (norm + RoPE at ``4j``); both go through
the plan's QK treatment (``dsv4.plan.INDEXER_QK_TREATMENT``: the official Hadamard + FP4 fake
quantization, or nothing). ``I(t, j) = sum_h w_{t,h} ReLU(q_{t,h} . K_j)`` with
``w = weights_proj(x) * di^-1/2 * Hi^-1/2``; entries ``j >= (t+1)//m`` are masked to -inf; top-k with
``k = min(index_topk, N)``; a selected entry that is still masked becomes -1.
"""
from __future__ import annotations

from typing import Callable

import torch

from .. import probes
from ..numerics import fp4_fake_quantize_pow2, hadamard_transform
from .compressor import Compressor
from .kv_cache import LayerCache
from .linear import Linear
from .norm import NormedInput
from .rope import Rope

INDEXER_FP4_BLOCK = 32
SCORE_ELEMENTS = 1 << 28    # FP32 dot products held at once by ``Indexer.scores`` (1 GiB; decode: one chunk)


def query_rows(T: int, per_row: int) -> int:
    """Queries per chunk so that a chunk holds at most ``SCORE_ELEMENTS`` dot products (at least one row)."""
    return max(1, min(T, SCORE_ELEMENTS // per_row))


def _hadamard_fp4(t: torch.Tensor) -> torch.Tensor:
    """Hadamard(di)/sqrt(di), then E2M1 fake quantization with power-of-two scales per 32 (spec §12)."""
    return fp4_fake_quantize_pow2(hadamard_transform(t), INDEXER_FP4_BLOCK)


QK_TREATMENTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "hadamard+fp4": _hadamard_fp4,
    "none": lambda t: t,
}


class Indexer:
    def __init__(self, prefix: str, wq_b: Linear, weights_proj: Linear, compressor: Compressor, rope: Rope, *,
                 n_heads: int, head_dim: int, topk: int, ratio: int, qk_treatment: str) -> None:
        self.prefix = prefix
        self.wq_b, self.weights_proj, self.compressor = wq_b, weights_proj, compressor
        self.rope = rope
        self.n_heads, self.head_dim, self.topk, self.ratio = n_heads, head_dim, topk, ratio
        self.qk_treatment = qk_treatment
        self.qk_quant = QK_TREATMENTS[qk_treatment]

    def query(self, q_lat: torch.Tensor | NormedInput) -> torch.Tensor:
        return self.wq_b(q_lat).unflatten(-1, (self.n_heads, self.head_dim))

    def apply_rope(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.rope.apply(t, positions)

    def rotate_quantize(self, t: torch.Tensor) -> torch.Tensor:
        return self.qk_quant(t)

    def head_weights(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        """``weights_proj(x) * di^-1/2 * Hi^-1/2`` in FP32 ``[T, Hi]`` (constants from the indexer sizes)."""
        return self.weights_proj(x).to(torch.float32) * (self.head_dim ** -0.5 * self.n_heads ** -0.5)

    def scores(self, q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``I(t, j) = sum_h w[t, h] * relu(q[t, h] . K[j])`` in FP32 ``[T, N]``, queries in chunks: the
        ``[T, Hi, N]`` dot products whole are T·N·Hi·4 bytes (69 GB for a 32k Flash prefill). A chunk's GEMM
        may block its rows differently from the whole's (last-ulp differences): one chunk whenever it fits."""
        kf = keys.to(torch.float32)
        step = query_rows(q.shape[0], self.n_heads * max(1, keys.shape[0]))
        out = [torch.einsum("th,thn->tn", w[a:a + step],
                            torch.relu(torch.einsum("thd,nd->thn", q[a:a + step].to(torch.float32), kf)))
               for a in range(0, max(1, q.shape[0]), step)]
        return out[0] if len(out) == 1 else torch.cat(out)

    def causal_mask(self, scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """-inf where entry j has not closed at query t: ``j >= (t+1) // m``."""
        limit = (positions + 1) // self.ratio
        j = torch.arange(scores.shape[1], device=scores.device)
        return scores.masked_fill(j[None, :] >= limit[:, None], float("-inf"))

    def select(self, masked: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Top ``min(index_topk, N)`` ids per row, invalid -> -1, sorted ascending with -1 last."""
        k = min(self.topk, masked.shape[1])
        # ReLU scores are often exactly equal (all heads negative -> 0): break ties toward the lower
        # entry id with a stable sort, so the selection is deterministic (torch.topk's is not).
        idx = masked.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        limit = ((positions + 1) // self.ratio)[:, None]
        big = torch.iinfo(torch.int64).max
        idx = torch.where(idx < limit, idx, torch.full_like(idx, big)).sort(dim=-1).values
        return torch.where(idx == big, torch.full_like(idx, -1), idx)

    def update_keys(self, x: torch.Tensor | NormedInput, cache: LayerCache, start: int,
                    projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        new, _ = self.compressor(x, cache.index_compressor, start, projected)
        probes.emit(self.prefix + "attn.indexer.k", new)
        if new.shape[0] == 0 and cache.index_keys is not None:
            return cache.index_keys     # no block closed: nothing to rotate (most decode steps)
        new = self.rotate_quantize(new)
        cache.index_keys = new if cache.index_keys is None else torch.cat((cache.index_keys, new))
        return cache.index_keys

    def prepare(self, x: torch.Tensor | NormedInput, q_lat: torch.Tensor | NormedInput, positions: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        """The work on the new tokens alone, whatever the caches hold: the treated query, the head weights
        and the compressor's projections (a graph decode step makes them in a captured piece)."""
        q = self.apply_rope(self.query(q_lat), positions)
        probes.emit(self.prefix + "attn.indexer.q", q)
        return (self.rotate_quantize(q), self.head_weights(x)) + self.compressor.project(x)

    def __call__(self, x: torch.Tensor | NormedInput, q_lat: torch.Tensor | NormedInput, positions: torch.Tensor,
                 cache: LayerCache, start: int, prepared: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
        q, w, kv, gate = self.prepare(x, q_lat, positions) if prepared is None else prepared
        keys = self.update_keys(x, cache, start, (kv, gate))
        masked = self.causal_mask(self.scores(q, keys, w), positions)
        probes.emit(self.prefix + "attn.indexer.scores", masked)
        topk = self.select(masked, positions)
        probes.emit(self.prefix + "attn.indexer.topk", topk)
        return topk
