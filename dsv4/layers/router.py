"""MoE router (spec §9 steps 1-4): FP32 gate logits, sqrt-softplus scores, top-k selection (with the
correction bias for SELECTION only) or the hash table ``tid2eid`` (hash layers), renormalized weights
from the unbiased scores, times ``routed_scaling_factor``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import probes
from .linear import Linear
from .norm import NormedInput


class Router:
    """Score routing: ``ids = topk(s + bias)``; ``gate`` is the ``ffn.gate`` linear (FP32 output)."""

    def __init__(self, prefix: str, gate: Linear, *, topk: int, route_scale: float,
                 bias: torch.Tensor | None) -> None:
        self.prefix = prefix
        self.gate = gate
        self.topk = topk
        self.route_scale = float(route_scale)
        self.bias = None if bias is None else bias.to(torch.float32)

    def logits(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        return self.gate(x).to(torch.float32)

    def score(self, logits: torch.Tensor) -> torch.Tensor:
        """``sqrt(softplus(l))`` (beta 1; identity above 20 as torch and the VL kernel do)."""
        return torch.sqrt(F.softplus(logits))

    def select(self, scores: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Top-k of the biased scores, in score order; the bias never reaches the weights."""
        biased = scores if self.bias is None else scores + self.bias
        return biased.topk(self.topk, dim=-1).indices

    def weigh(self, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Unbiased scores of the selected experts, renormalized, times the routed scaling factor."""
        w = scores.gather(-1, ids)
        return w / w.sum(dim=-1, keepdim=True) * self.route_scale

    def route(self, logits: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.score(logits)
        ids = self.select(scores, token_ids)
        return ids, self.weigh(scores, ids)

    def __call__(self, x: torch.Tensor | NormedInput, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.logits(x)
        probes.emit(self.prefix + "ffn.router.logits", logits)
        ids, weights = self.route(logits, token_ids)
        probes.emit(self.prefix + "ffn.router.topk_ids", ids)
        probes.emit(self.prefix + "ffn.router.weights", weights)
        return ids, weights


class HashRouter(Router):
    """Hash layers (index < num_hash_layers): ``ids = tid2eid[token_id]``, no bias (spec §9 step 3)."""

    def __init__(self, prefix: str, gate: Linear, *, topk: int, route_scale: float, tid2eid: torch.Tensor) -> None:
        super().__init__(prefix, gate, topk=topk, route_scale=route_scale, bias=None)
        self.tid2eid = tid2eid.to(torch.int64)

    def select(self, scores: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return self.tid2eid[token_ids.to(self.tid2eid.device)].to(scores.device)
