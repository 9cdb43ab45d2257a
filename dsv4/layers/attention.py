"""Attention (spec §5, §8): shared-KV MQA with head_dim d, partial interleaved RoPE, learned sink in the
softmax denominator, sliding window, compressed entries (HCA: all closed entries; CSA: the indexer's
top-k), inverse RoPE on the output, grouped low-rank output projection.

Prefill and decode are one code path: ``__call__`` appends T tokens at position ``start`` to the
layer's caches (the window ring holds the last W rows, so a query sees the previous W-1 tokens plus
the new ones). Queries are processed in chunks to bound the score memory. Numerics (spec §12): q and
kv BF16, scores and softmax statistics FP32, probabilities cast to BF16 before P.V (FP32
accumulation), BF16 output.
"""
from __future__ import annotations

import torch

from .. import probes
from .compressor import Compressor
from .grouped_linear import GroupedLinear
from .indexer import Indexer
from .kv_cache import KVStorage, LayerCache, StoredKV
from .linear import Linear
from .norm import NormedInput, RMSNorm, rms_normalize
from .rope import Rope

QUERY_CHUNK = 256


class Attention:
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, prefix: str, *, wq_a: Linear, q_norm: RMSNorm, wq_b: Linear, wkv: Linear, kv_norm: RMSNorm,
                 wo_a: GroupedLinear, wo_b: Linear, sink: torch.Tensor, rope: Rope, kv_storage: KVStorage,
                 compressor: Compressor | None, indexer: Indexer | None, n_heads: int, head_dim: int,
                 o_groups: int, window: int, ratio: int, eps: float) -> None:
        self.prefix = prefix
        self.wq_a, self.q_norm, self.wq_b = wq_a, q_norm, wq_b
        self.wkv, self.kv_norm = wkv, kv_norm
        self.wo_a, self.wo_b = wo_a, wo_b
        self.sink = sink.to(torch.float32)
        self.rope = rope
        self.kv_storage = kv_storage
        self.compressor, self.indexer = compressor, indexer
        self.n_heads, self.head_dim, self.o_groups = n_heads, head_dim, o_groups
        self.window, self.ratio, self.eps = window, ratio, eps
        self.scale = head_dim ** -0.5

    # ---- projections -------------------------------------------------------------------------
    def query(self, x: torch.Tensor | NormedInput) -> tuple[torch.Tensor, NormedInput]:
        """``q = head_norm(wq_b(q_norm(wq_a x)))`` ``[T, H, d]`` and the latent ``q_lat`` (the indexer's input)."""
        q_lat = self.q_norm.defer(self.wq_a(x))
        q = self.wq_b(q_lat).unflatten(-1, (self.n_heads, self.head_dim))
        return self.head_norm(q), q_lat

    def head_norm(self, q: torch.Tensor) -> torch.Tensor:
        """Per-head unweighted RMSNorm over d (spec §5 step 1)."""
        return rms_normalize(q, None, self.eps).to(self.act_dtype)

    def key_value(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        """The single K=V head ``kv_norm(wkv x)`` ``[T, d]``."""
        return self.kv_norm(self.wkv(x))

    def apply_rope(self, t: torch.Tensor, positions: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        return self.rope.apply(t, positions, inverse=inverse)

    # ---- the attention core ------------------------------------------------------------------
    def scores(self, q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """FP32 ``q.k * d^-1/2`` -> ``[H, Tq, K]``; ``keys`` shared ``[K, d]`` or per query ``[Tq, K, d]``."""
        qf, kf = q.to(torch.float32), keys.to(torch.float32)
        eq = "thd,kd->htk" if keys.dim() == 2 else "thd,tkd->htk"
        return torch.einsum(eq, qf, kf) * self.scale

    def softmax_with_sink(self, scores: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
        """``exp(s) / (sum exp(s) + exp(sink_h))`` over the valid keys: the sink is a virtual key with
        zero value, present only in the denominator (spec §5 step 5). FP32."""
        s = scores.masked_fill(~valid[None], float("-inf"))
        mx = torch.maximum(s.amax(dim=-1, keepdim=True), sink[:, None, None])
        e = torch.exp(s - mx)
        return e / (e.sum(dim=-1, keepdim=True) + torch.exp(sink[:, None, None] - mx))

    def weighted_values(self, p: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """``P.V`` with P cast to the activation dtype (BF16) first, FP32 accumulation -> FP32 ``[Tq, H, d]``."""
        pf = p.to(self.act_dtype).to(torch.float32)
        eq = "htk,kd->thd" if values.dim() == 2 else "htk,tkd->thd"
        return torch.einsum(eq, pf, values.to(torch.float32))

    def compressed_keys(self, entries: torch.Tensor, topk: torch.Tensor | None, positions: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Compressed keys of a query chunk and their validity: HCA all closed entries
        ``j < (t+1)//m``; CSA the indexer's selection (gathered per query, -1 invalid)."""
        if topk is None:
            j = torch.arange(entries.shape[0], device=entries.device)
            return entries, j[None, :] < ((positions + 1) // self.ratio)[:, None]
        return entries[topk.clamp(min=0)], topk >= 0

    def attend(self, q: torch.Tensor, raw: torch.Tensor, raw_pos: torch.Tensor, entries: torch.Tensor | None,
               topk: torch.Tensor | None, positions: torch.Tensor, *, start: int | None = None) -> torch.Tensor:
        """One softmax over the window keys and the compressed keys, in query chunks -> BF16 ``[T, H, d]``.

        ``start``: the first query's position, where ``positions`` are ``start, start + 1, ...`` and
        ``raw_pos`` the consecutive positions ending at the last query's (as :meth:`window_keys` returns
        them): each chunk's window bounds then come from host integers instead of two ``searchsorted``
        host reads, each a device synchronization in every decode step."""
        out = []
        for a in range(0, q.shape[0], QUERY_CHUNK):
            b = min(a + QUERY_CHUNK, q.shape[0])
            pos = positions[a:b]
            if start is None:
                lo = int(torch.searchsorted(raw_pos, pos[0] - self.window + 1))
                hi = int(torch.searchsorted(raw_pos, pos[-1], right=True))
            else:
                first, n = start + q.shape[0] - raw_pos.shape[0], raw_pos.shape[0]
                lo = min(max(start + a - self.window + 1 - first, 0), n)
                hi = min(max(start + b - first, 0), n)
            kw, kpos = raw[lo:hi], raw_pos[lo:hi]
            valid_w = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] > pos[:, None] - self.window)
            parts = [(kw, valid_w)]
            if entries is not None and entries.shape[0] > 0:
                parts.append(self.compressed_keys(entries, None if topk is None else topk[a:b], pos))
            s = torch.cat([self.scores(q[a:b], k) for k, _ in parts], dim=-1)
            valid = torch.cat([v for _, v in parts], dim=-1)
            p = self.softmax_with_sink(s, valid, self.sink)
            o, off = 0.0, 0
            for k, _ in parts:
                n = k.shape[-2]
                o = o + self.weighted_values(p[..., off:off + n], k)
                off += n
            out.append(o.to(self.act_dtype))
        return torch.cat(out)

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """Grouped low-rank output: group g (heads g*H/G..) -> ``z_g = W_oa[g] o_g``, then ``wo_b`` (§5 step 7)."""
        T, G = o.shape[0], self.o_groups
        rows = o.reshape(T, G, -1).transpose(0, 1).reshape(G * T, -1)   # group-major rows
        offsets = torch.arange(G + 1, dtype=torch.int32, device=o.device) * T
        z = self.wo_a(rows, offsets).reshape(G, T, -1).transpose(0, 1).reshape(T, -1)
        return self.wo_b(z)

    # ---- caches ------------------------------------------------------------------------------
    def window_keys(self, kv: torch.Tensor, cache: LayerCache, start: int, stored: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new rows; return every raw key a new query can see (as stored: encoded, then decoded)
        and its positions. ``stored``: ``kv_storage.roundtrip(kv)`` made earlier (in a graph decode step's
        captured piece). The ring keeps the rows decoded (decoding is row by row: bit for bit the same)."""
        new = self.kv_storage.roundtrip(kv) if stored is None else stored
        prev: StoredKV | None = cache.window.recent(self.window - 1)
        rows = new if prev is None else torch.cat((prev.parts["kv"], new))
        cache.window.write(start, StoredKV({"kv": new}))
        first = start + kv.shape[0] - len(rows)
        return rows, torch.arange(first, start + kv.shape[0], device=kv.device)

    def compressed_entries(self, x: torch.Tensor | NormedInput, cache: LayerCache, start: int,
                           projected: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """Feed the compressor; store its new entries; return every entry so far, decoded. The decoded
        entries are kept beside the stored ones (decoding is row by row, so appending the new rows'
        decoding is the decoding of the whole, bit for bit): a decode step neither decodes the whole
        cache again nor encodes the empty block of a step that closes none (most steps)."""
        if self.compressor is None:
            return None
        new, _ = self.compressor(x, cache.compressor, start, projected)
        if new.shape[0] == 0 and cache.compressed is not None:
            probes.emit(self.prefix + "attn.compressed_kv", cache.compressed_decoded[:0])
            return cache.compressed_decoded
        stored = self.kv_storage.encode(new)
        decoded = self.kv_storage.decode(stored)
        probes.emit(self.prefix + "attn.compressed_kv", decoded)
        first = cache.compressed is None
        cache.compressed = stored if first else cache.compressed.cat(stored)
        cache.compressed_decoded = decoded if first else torch.cat((cache.compressed_decoded, decoded))
        return cache.compressed_decoded

    # ---- forward -----------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor | NormedInput, cache: LayerCache, start: int) -> torch.Tensor:
        T = x.shape[0]
        positions = torch.arange(start, start + T, device=x.device)
        q, q_lat = self.query(x)
        probes.emit(self.prefix + "attn.q", q)
        q = self.apply_rope(q, positions)
        kv = self.key_value(x)
        probes.emit(self.prefix + "attn.kv", kv)
        raw, raw_pos = self.window_keys(self.apply_rope(kv, positions), cache, start)
        entries = self.compressed_entries(x, cache, start)
        topk = None if self.indexer is None else self.indexer(x, q_lat, positions, cache, start)
        o = self.apply_rope(self.attend(q, raw, raw_pos, entries, topk, positions, start=start), positions, inverse=True)
        probes.emit(self.prefix + "attn.core", o)
        out = self.output(o)
        probes.emit(self.prefix + "attn.out", out)
        return out
