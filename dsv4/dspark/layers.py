"""The draft's layer objects (docs/dspark.md §Equations): the block attention over a stage's ring and
the γ block rows (non-causal), one stage block, the join of the target layers, and the draft head
(collapse, norm, the trunk's LM head, Markov correction, confidence).

Numerics follow the trunk's native layers (dsv4.layers): FP32 scores and softmax statistics,
probabilities cast to the activation dtype before P·V, FP32 mHC; the rings store what the plan's
``kv_cache`` format stores."""
from __future__ import annotations

import torch

from .. import probes
from ..layers.attention import Attention
from ..layers.kv_cache import StoredKV, WindowCache
from ..layers.linear import Linear
from ..layers.mhc import HCHead, HyperConnection
from ..layers.moe import MoE
from ..layers.norm import RMSNorm


class DraftAttention(Attention):
    """A stage's attention: the trunk's q and kv paths on the block rows; every row sees the ring's
    valid context entries and all γ block keys (Eq 9-14). No compressor, no indexer."""

    def context_entries(self, m: torch.Tensor, positions: torch.Tensor) -> StoredKV:
        """Eq 4: ``RoPE_t(kv_norm(wkv m_t))``, encoded as the plan's KV storage stores it."""
        stored = self.kv_storage.encode(self.apply_rope(self.key_value(m), positions))
        if probes.active():
            probes.emit(self.prefix + "attn.context_kv", self.kv_storage.decode(stored))
        return stored

    def __call__(self, x, ring: WindowCache, positions: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        q, _ = self.query(x)
        probes.emit(self.prefix + "attn.q", q)
        q = self.apply_rope(q, positions)
        kv = self.key_value(x)
        probes.emit(self.prefix + "attn.kv", kv)
        block = self.kv_storage.roundtrip(self.apply_rope(kv, positions))
        ctx = ring.recent(self.window)
        keys = block if ctx is None else torch.cat((self.kv_storage.decode(ctx), block))
        s = self.scores(q, keys)
        p = self.softmax_with_sink(s, torch.ones(s.shape[1:], dtype=torch.bool, device=s.device), self.sink)
        o = self.weighted_values(p, keys).to(self.act_dtype)
        o = self.apply_rope(o, positions, inverse=True)
        probes.emit(self.prefix + "attn.core", o)
        out = self.output(o)
        probes.emit(self.prefix + "attn.out", out)
        return out


class DraftStage:
    """Stage ``mtp.{stage}``: HC_pre -> attn_norm -> block attention -> HC_post, then the same around
    the score-routed MoE; probes as trunk layer ``index`` = L + stage."""

    def __init__(self, stage: int, index: int, *, hc_attn: HyperConnection, attn_norm: RMSNorm,
                 attention: DraftAttention, hc_ffn: HyperConnection, ffn_norm: RMSNorm, moe: MoE,
                 window: int, device: torch.device) -> None:
        self.stage, self.index, self.prefix = stage, index, f"layers.{index}."
        self.hc_attn, self.attn_norm, self.attention = hc_attn, attn_norm, attention
        self.hc_ffn, self.ffn_norm, self.moe = hc_ffn, ffn_norm, moe
        self.window, self.device = window, device

    def new_ring(self) -> WindowCache:
        return WindowCache(self.window)

    def __call__(self, X: torch.Tensor, ring: WindowCache, positions: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        p = self.prefix
        pre, post, comb = self.hc_attn.mix(X)
        x = self.hc_attn.collapse(X, pre)
        probes.emit(p + "hc.attn.pre", x)
        a = self.attention(self.attn_norm.defer(x), ring, positions)
        X = self.hc_attn.post(a, X, post, comb)
        probes.emit(p + "hc.attn.post", X)
        pre, post, comb = self.hc_ffn.mix(X)
        x = self.hc_ffn.collapse(X, pre)
        probes.emit(p + "hc.ffn.pre", x)
        f = self.moe(self.ffn_norm.defer(x), ids)
        X = self.hc_ffn.post(f, X, post, comb)
        probes.emit(p + "out", X)
        return X


class Join:
    """Eq 3: ``m_t = main_norm(main_proj(M_t))``, shared by every stage."""

    def __init__(self, proj: Linear, norm: RMSNorm) -> None:
        self.proj, self.norm = proj, norm

    def __call__(self, main_hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(main_hidden))


class ProjectedHCHead(HCHead):
    """The drafter's collapse with its projection ``flat @ fn^T`` run by a planned linear (an NVFP4
    GEMM when ``draft_hc_head`` is fp4); the gate math stays FP32."""

    def __init__(self, proj: Linear, base: torch.Tensor, scale: torch.Tensor, *, hc_eps: float, rms_eps: float) -> None:
        super().__init__(torch.zeros(0), base, scale, hc_eps=hc_eps, rms_eps=rms_eps)
        self.proj = proj

    def weights(self, X: torch.Tensor) -> torch.Tensor:
        flat = X.to(torch.float32).flatten(-2)
        rho = torch.rsqrt(flat.pow(2).mean(dim=-1, keepdim=True) + self.rms_eps)
        mu = rho * self.proj(X.flatten(-2)).to(torch.float32)
        return torch.sigmoid(mu * self.scale[0] + self.base) + self.hc_eps


class DraftHead:
    """Eq 15-18 on the last stage's streams: collapse z, base logits U = head(norm(z)) (the trunk's LM
    head), per row ℓ_r = U_r + W₂ W₁[prev_r] and confidence w_c·[z_r; W₁[prev_r]] (raw logit)."""

    def __init__(self, hc_head: HCHead, norm: RMSNorm, lm_head: Linear, markov_w1: torch.Tensor,
                 markov_w2: Linear, confidence: Linear) -> None:
        self.hc_head, self.norm, self.lm_head = hc_head, norm, lm_head
        self.markov_w1, self.markov_w2, self.confidence = markov_w1, markov_w2, confidence

    def base(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.hc_head(X)
        probes.emit("dspark.hc_head", z)
        u = self.lm_head(self.norm.defer(z)).to(torch.float32)
        probes.emit("dspark.base_logits", u)
        return z, u

    def row(self, z_r: torch.Tensor, u_r: torch.Tensor, prev: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ℓ_r [V] fp32, confidence [] fp32) of one row corrected from the token ``prev`` before it."""
        e = self.markov_w1[prev].to(z_r.dtype)[None]
        logits = u_r + self.markov_w2(e)[0].to(torch.float32)
        conf = self.confidence(torch.cat((z_r[None], e), dim=-1))[0, 0].to(torch.float32)
        return logits, conf
