"""One transformer block (spec §3): mHC pre -> attn_norm -> attention -> mHC post, then the same
around the MoE. The pre-norms stay deferred (``NormedInput``) so FP4 consumers fuse them.
"""
from __future__ import annotations

import torch

from .. import probes
from .attention import Attention
from .kv_cache import LayerCache
from .mhc import HyperConnection
from .moe import MoE
from .norm import RMSNorm


class Block:
    def __init__(self, index: int, *, hc_attn: HyperConnection, attn_norm: RMSNorm, attention: Attention,
                 hc_ffn: HyperConnection, ffn_norm: RMSNorm, moe: MoE, device: torch.device) -> None:
        self.index = index
        self.prefix = f"layers.{index}."
        self.hc_attn, self.attn_norm, self.attention = hc_attn, attn_norm, attention
        self.hc_ffn, self.ffn_norm, self.moe = hc_ffn, ffn_norm, moe
        self.device = device

    def __call__(self, X: torch.Tensor, cache: LayerCache, start: int, token_ids: torch.Tensor) -> torch.Tensor:
        p = self.prefix
        pre, post, comb = self.hc_attn.mix(X)
        x = self.hc_attn.collapse(X, pre)
        probes.emit(p + "hc.attn.pre", x)
        a = self.attention(self.attn_norm.defer(x), cache, start)
        X = self.hc_attn.post(a, X, post, comb)
        probes.emit(p + "hc.attn.post", X)
        pre, post, comb = self.hc_ffn.mix(X)
        x = self.hc_ffn.collapse(X, pre)
        probes.emit(p + "hc.ffn.pre", x)
        f = self.moe(self.ffn_norm.defer(x), token_ids)
        X = self.hc_ffn.post(f, X, post, comb)
        probes.emit(p + "out", X)
        cache.length = start + X.shape[0]
        return X
