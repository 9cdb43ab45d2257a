"""KV compressor (spec §6): CSA (ratio m = csa_ratio, overlapping windows of 2m) and HCA (m = hca_ratio),
and the indexer's own CSA compressor (width index_head_dim).

Per token p: ``C_p = W_kv x_p`` and ``Z_p = W_gate x_p`` (FP32 results); the positional bias ``ape``
is added to the gate logits only (never to C) inside ``pool``. Only complete blocks produce entries;
entry j pools block j (HCA), or the a-half of block j-1 and the b-half of block j (CSA) with one
per-channel softmax over all slots. Then BF16 -> RMSNorm -> RoPE at position ``j * m``.

Streaming: the caller passes the new tokens only; unpooled projections are carried in a
``CompressorState`` so a chunked or token-by-token run forms exactly the entries of a full prefill.
"""
from __future__ import annotations

import torch

from .kv_cache import CompressorState
from .linear import Linear
from .norm import NormedInput, RMSNorm
from .rope import Rope


class Compressor:
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, name: str, wkv: Linear, wgate: Linear, ape: torch.Tensor, norm: RMSNorm, *, ratio: int,
                 overlap: bool, width: int, rope: Rope) -> None:
        k = 2 if overlap else 1
        if tuple(ape.shape) != (ratio, k * width):
            raise ValueError(f"{name}.ape: expected shape {[ratio, k * width]}, found {list(ape.shape)}")
        self.name = name
        self.wkv, self.wgate = wkv, wgate
        self.ape = ape.to(torch.float32)
        self.norm = norm
        self.ratio, self.overlap, self.width = ratio, overlap, width
        self.rope = rope

    def project(self, x: torch.Tensor | NormedInput) -> tuple[torch.Tensor, torch.Tensor]:
        """``(C, Z)`` FP32 ``[T, k*c]`` (Z without the ape)."""
        return self.wkv(x).to(torch.float32), self.wgate(x).to(torch.float32)

    def windows(self, kv: torch.Tensor, gate: torch.Tensor, prev_kv: torch.Tensor | None,
                prev_gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Complete blocks ``[B, m, k*c]`` -> the pooled slots ``(kv [B, S, c], gate [B, S, c], ape [S, c])``.

        CSA: S = 2m, slots = a-half of the previous block, then b-half of the block itself; the block
        before entry 0 does not exist: C = 0 and Z = -inf there (zero weight)."""
        if not self.overlap:
            return kv, gate, self.ape
        c = self.width
        if prev_kv is None:
            prev_kv = torch.zeros_like(kv[0])
            prev_gate = torch.full_like(gate[0], float("-inf"))
        pkv = torch.cat((prev_kv[None], kv[:-1]))
        pgate = torch.cat((prev_gate[None], gate[:-1]))
        kv_w = torch.cat((pkv[..., :c], kv[..., c:]), dim=1)
        gate_w = torch.cat((pgate[..., :c], gate[..., c:]), dim=1)
        ape_w = torch.cat((self.ape[:, :c], self.ape[:, c:]), dim=0)
        return kv_w, gate_w, ape_w

    def pool(self, kv: torch.Tensor, gate_logits: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
        """Per-channel softmax over the slots of ``gate_logits + ape``, weighted sum of ``kv`` -> FP32 ``[B, c]``.
        The bias goes on the gate logits ONLY (spec §6 step 1)."""
        w = torch.softmax(gate_logits + ape, dim=1)
        return (w * kv).sum(dim=1)

    def normalize(self, pooled: torch.Tensor) -> torch.Tensor:
        """Cast to BF16, then the weighted RMSNorm (spec §6 step 5)."""
        return self.norm(pooled.to(self.act_dtype))

    def apply_rope(self, entries: torch.Tensor, first: int) -> torch.Tensor:
        """RoPE at position ``j * m`` for entry j (the first token of block j, §6 step 6)."""
        pos = torch.arange(first, first + entries.shape[0], device=entries.device) * self.ratio
        return self.rope.apply(entries, pos)

    def __call__(self, x: torch.Tensor | NormedInput, state: CompressorState, start: int,
                 projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, int]:
        """Feed the tokens at positions ``start..start+T-1``; returns ``(new entries BF16 [B, c], first index)``.
        ``projected``: ``project(x)`` made earlier (a graph decode step projects in a captured piece)."""
        m = self.ratio
        kv, gate = self.project(x) if projected is None else projected
        buffered = 0 if state.tail_kv is None else int(state.tail_kv.shape[0])
        first = state.entries
        if start - buffered != first * m:
            raise RuntimeError(f"{self.name}: expected new tokens at position {first * m + buffered} (block "
                               f"{first} + {buffered} buffered), found position {start}")
        if buffered:
            kv, gate = torch.cat((state.tail_kv, kv)), torch.cat((state.tail_gate, gate))
        nb = kv.shape[0] // m
        used = nb * m
        state.tail_kv, state.tail_gate = kv[used:].clone(), gate[used:].clone()
        if nb == 0:
            return kv.new_zeros((0, self.width), dtype=self.act_dtype), first
        bkv, bgate = kv[:used].unflatten(0, (nb, m)), gate[:used].unflatten(0, (nb, m))
        kv_w, gate_w, ape_w = self.windows(bkv, bgate, state.prev_kv, state.prev_gate)
        entries = self.apply_rope(self.normalize(self.pool(kv_w, gate_w, ape_w)), first)
        if self.overlap:
            state.prev_kv, state.prev_gate = bkv[-1].clone(), bgate[-1].clone()
        state.entries = first + nb
        return entries, first

