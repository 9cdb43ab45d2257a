"""Attention (spec §5) with the key-set assembly of §8: shared-KV MQA, head_dim d, partial
interleaved RoPE, learned sink, sliding window plus compressed entries, grouped low-rank output."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4 import probes

from .compressor import Compressor
from .fakequant import fake_quant_fp8
from .indexer import Indexer, visible_entries
from .ops import ACC, linear, rms_norm, unweighted_rms_norm
from .rope import RopeSpec, apply_rope, cos_sin
from .state import LayerCache

KV_FP8_BLOCK = 64          # §12 rows 2-3
_SCORE_BUDGET = 1 << 26    # fp32 score elements per query chunk (bounds memory on long prompts)


@dataclass(frozen=True)
class AttentionWeights:
    wq_a: torch.Tensor
    q_norm: torch.Tensor
    wq_b: torch.Tensor
    wkv: torch.Tensor
    kv_norm: torch.Tensor
    wo_a: torch.Tensor
    wo_b: torch.Tensor
    attn_sink: torch.Tensor   # [H] fp32


@dataclass(frozen=True)
class AttentionShape:
    n_heads: int
    head_dim: int
    rope_dim: int
    window: int
    o_groups: int
    o_lora_rank: int
    eps: float


def kv_fake_quant(kv: torch.Tensor, rope_dim: int) -> torch.Tensor:
    """§12: FP8 (block 64, UE8M0) on the nope dims; the rope dims stay in the activation dtype."""
    return torch.cat((fake_quant_fp8(kv[..., :-rope_dim], KV_FP8_BLOCK), kv[..., -rope_dim:]), dim=-1)


def window_keys(cache: LayerCache, kv: torch.Tensor, start: int, window: int) -> tuple[torch.Tensor, int]:
    """§8: the raw kv rows this call's queries may see: cached positions max(0, start−W+1)..start−1
    (from the ring, slot p mod W), then the new rows. Returns the rows and the first row's position."""
    lo = max(0, start - window + 1)
    if start == lo:
        return kv, start
    slots = torch.arange(lo, start, device=kv.device) % window
    return torch.cat((cache.ring[slots], kv)), lo


def update_ring(cache: LayerCache, kv: torch.Tensor, start: int, window: int) -> None:
    if cache.ring is None:
        cache.ring = kv.new_zeros((window, kv.shape[-1]))
    n = min(kv.shape[0], window)
    pos = torch.arange(start + kv.shape[0] - n, start + kv.shape[0], device=kv.device)
    cache.ring[pos % window] = kv[-n:]


def sparse_attention(q: torch.Tensor, keys: torch.Tensor, key0: int, comp: torch.Tensor | None,
                     comp_mask: torch.Tensor | None, positions: torch.Tensor, window: int, sink: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """§5 step 5 over the §8 key set: per query t the raw keys at positions t−W+1..t and the
    compressed entries allowed by ``comp_mask`` [T, N], one softmax whose denominator also holds
    exp(sink_h). K = V (one shared head). Scores and probabilities are fp32 values (§12), the
    probabilities rounded to the activation dtype before P·V; sums accumulate in fp64 (ops.py)."""
    T, H, _ = q.shape
    n_comp = 0 if comp is None else comp.shape[0]
    chunk = max(1, min(256, _SCORE_BUDGET // max(1, H * (window + 255 + n_comp))))
    sink = sink.float()
    out = []
    for a in range(0, T, chunk):
        p = positions[a:a + chunk]
        k_lo = max(int(p[0]) - window + 1, key0) - key0
        k_hi = int(p[-1]) + 1 - key0
        kv = keys[k_lo:k_hi]
        kpos = torch.arange(key0 + k_lo, key0 + k_hi, device=q.device)
        seen = (kpos <= p.unsqueeze(1)) & (kpos > p.unsqueeze(1) - window)            # [c, K]
        if n_comp:
            kv = torch.cat((kv, comp))
            seen = torch.cat((seen, comp_mask[a:a + chunk]), dim=-1)
        s = (torch.einsum("thd,kd->thk", q[a:a + chunk].to(ACC), kv.to(ACC)) * scale).float()
        s = s.masked_fill(~seen.unsqueeze(1), float("-inf"))                                # fp32 scores
        mx = torch.maximum(s.amax(dim=-1), sink)                                           # [c, H]
        e = torch.exp((s - mx.unsqueeze(-1)).to(ACC))
        denom = e.sum(dim=-1) + torch.exp((sink - mx).to(ACC))
        prob = (e / denom.unsqueeze(-1)).float().to(q.dtype)
        out.append(torch.einsum("thk,kd->thd", prob.to(ACC), kv.to(ACC)).float().to(q.dtype))
    return torch.cat(out)


def project_qkv(w: AttentionWeights, s: AttentionShape, quant: dict[str, bool], x: torch.Tensor,
                cs: tuple[torch.Tensor, torch.Tensor], kv_fp8: bool, prefix: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """§5 steps 1-2 on the attn-normed rows x [T, D]: the roped queries [T, H, d], the query latent
    (the indexer's input) and the roped single K=V head [T, d] (FP8 nope dims when ``kv_fp8``).
    Emits ``{prefix}attn.q`` and ``{prefix}attn.kv`` before RoPE."""
    T = x.shape[0]
    q_lat = rms_norm(linear(x, w.wq_a, quant["attn.wq_a"]), w.q_norm, s.eps)
    q = unweighted_rms_norm(linear(q_lat, w.wq_b, quant["attn.wq_b"]).view(T, s.n_heads, s.head_dim), s.eps)
    probes.emit(f"{prefix}attn.q", q)
    kv = rms_norm(linear(x, w.wkv, quant["attn.wkv"]), w.kv_norm, s.eps)
    probes.emit(f"{prefix}attn.kv", kv)
    kv = apply_rope(kv, cs)
    if kv_fp8:
        kv = kv_fake_quant(kv, s.rope_dim)
    return apply_rope(q, cs), q_lat, kv


def grouped_output(o: torch.Tensor, w: AttentionWeights, s: AttentionShape, quant: dict[str, bool],
                   dtype: torch.dtype) -> torch.Tensor:
    """§5 step 7: group g = heads (H/G)g..; z_g = W_oa[g] o_g; out = W_ob z."""
    T, G, R = o.shape[0], s.o_groups, s.o_lora_rank
    z = torch.einsum("tgi,gri->tgr", o.reshape(T, G, -1).to(ACC), w.wo_a.to(ACC).view(G, R, -1)).float().to(dtype)
    return linear(z.flatten(1), w.wo_b, quant["attn.wo_b"])


class Attention:
    """§5 for one layer. ``__call__(x, positions, cache, layer)``: x is the attn-normed input [T, D];
    the layer's caches are read and extended."""

    def __init__(self, w: AttentionWeights, shape: AttentionShape, rope: RopeSpec, *, kind: str, ratio: int,
                 compressor: Compressor | None, indexer: Indexer | None, kv_fp8: bool,
                 quant: dict[str, bool]) -> None:
        self.w, self.s, self.rope, self.kind, self.ratio = w, shape, rope, kind, ratio
        self.compressor, self.indexer, self.kv_fp8, self.quant = compressor, indexer, kv_fp8, quant

    def _compressed(self, x: torch.Tensor, q_lat: torch.Tensor, positions: torch.Tensor, cache: LayerCache,
                    layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """§5 step 4: the compressed entries and which of them each query uses."""
        if self.compressor is None:
            return None, None
        new, _ = self.compressor(x, int(positions[0]), cache.compressor)
        if self.kv_fp8:
            new = kv_fake_quant(new, self.s.rope_dim)
        probes.emit(f"layers.{layer}.attn.compressed_kv", new)
        st = cache.compressor
        st.entries = new if st.entries is None else torch.cat((st.entries, new))
        n = st.n_entries
        if self.indexer is None:   # HCA: every closed block
            mask = torch.arange(n, device=x.device) < visible_entries(positions, self.ratio).unsqueeze(1)
            return st.entries, mask
        idx = self.indexer(x, q_lat, positions, cache.indexer, layer)   # CSA: the indexer's picks
        mask = torch.zeros((x.shape[0], n + 1), dtype=torch.bool, device=x.device)
        mask.scatter_(1, torch.where(idx < 0, n, idx), True)
        return st.entries, mask[:, :n]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache, layer: int) -> torch.Tensor:
        w, s = self.w, self.s
        start = int(positions[0])
        cs = cos_sin(self.rope, positions)
        # §5 steps 1-2: q_a -> q_norm -> q_b -> per-head RMSNorm -> RoPE; one K=V head, kv_norm, RoPE, FP8.
        q, q_lat, kv = project_qkv(w, s, self.quant, x, cs, self.kv_fp8, f"layers.{layer}.")
        keys, key0 = window_keys(cache, kv, start, s.window)
        update_ring(cache, kv, start, s.window)
        comp, comp_mask = self._compressed(x, q_lat, positions, cache, layer)
        o = sparse_attention(q, keys, key0, comp, comp_mask, positions, s.window, w.attn_sink, s.head_dim ** -0.5)
        # §5 step 6: rotate the output's rope dims back by −p·ω.
        o = apply_rope(o, cs, inverse=True)
        probes.emit(f"layers.{layer}.attn.core", o)
        out = grouped_output(o, w, s, self.quant, x.dtype)
        probes.emit(f"layers.{layer}.attn.out", out)
        return out
