"""Mixture of experts (spec §9): fp32 router with sqrt-softplus scores, hash routing on the first
num_hash_layers layers, clamped SwiGLU experts (routed and shared), fp32 accumulation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dsv4 import probes

from .ops import ACC, linear, mm


@dataclass(frozen=True)
class Routing:
    ids: torch.Tensor       # [T, k] int64 expert ids (score order; hash layers: tid2eid order)
    weights: torch.Tensor   # [T, k] fp32, renormalized × routed_scaling_factor


def route(x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
          token_ids: torch.Tensor, k: int, scale: float) -> tuple[torch.Tensor, Routing]:
    """§9 steps 1-4. Logits in fp32; s = √softplus(ℓ); the correction bias only for selection;
    weights from the unbiased scores of the selected experts, renormalized, × routed_scaling_factor."""
    logits = mm(x, gate.T).float()
    scores = F.softplus(logits.to(ACC)).sqrt().float()
    if tid2eid is not None:
        ids = tid2eid[token_ids]
        if int(ids.min()) < 0 or int(ids.max()) >= gate.shape[0]:
            raise ValueError(f"hash routing: expected tid2eid entries in [0, {gate.shape[0]}), found "
                             f"{int(ids.min())}..{int(ids.max())}")
    else:
        # Stable descending sort: score order, ties to the lower expert id (deterministic).
        ids = torch.sort(scores + bias.float(), dim=-1, descending=True, stable=True).indices[:, :k]
    w = scores.gather(1, ids).to(ACC)
    return logits, Routing(ids, (w / w.sum(dim=-1, keepdim=True) * scale).float())


def swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    """§9 step 5: gate = min(g, L); up = clamp(u, −L, L); silu(gate) · up, in fp32 (OFF-M Expert).
    A limit of 0 disables the clamp (OFF-M `if swiglu_limit > 0`)."""
    g, u = g.float(), u.float()
    if limit > 0:
        g, u = g.clamp(max=limit), u.clamp(min=-limit, max=limit)
    return (F.silu(g.to(ACC)) * u.to(ACC)).float()


def expert(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, limit: float,
           weight: torch.Tensor | None, quant: bool) -> torch.Tensor:
    """One SwiGLU expert. OFF-M folds the routing weight into the activation before w2 (fp32), then
    rounds to the activation dtype; §9 lists the placement as equivalent up to rounding."""
    a = swiglu(linear(x, w1, quant), linear(x, w3, quant), limit)
    if weight is not None:
        a = weight.unsqueeze(-1) * a
    return linear(a.to(x.dtype), w2, quant)


class MoE:
    """§9 for one layer. ``experts(e)`` returns (w1, w3, w2) of routed expert e, read on demand."""

    def __init__(self, gate: torch.Tensor, bias: torch.Tensor | None, tid2eid: torch.Tensor | None,
                 experts: Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *, k: int, scale: float,
                 limit: float, quant_routed: bool, quant_shared: bool) -> None:
        self.gate, self.bias, self.tid2eid, self.experts, self.shared = gate, bias, tid2eid, experts, shared
        self.k, self.scale, self.limit = k, scale, limit
        self.quant_routed, self.quant_shared = quant_routed, quant_shared

    def __call__(self, x: torch.Tensor, token_ids: torch.Tensor, layer: int) -> torch.Tensor:
        logits, r = route(x, self.gate, self.bias, self.tid2eid, token_ids, self.k, self.scale)
        probes.emit(f"layers.{layer}.ffn.router.logits", logits)
        probes.emit(f"layers.{layer}.ffn.router.topk_ids", r.ids)
        probes.emit(f"layers.{layer}.ffn.router.weights", r.weights)
        # §9 step 6: every (token, slot) pair adds its expert once; only selected experts are read.
        routed = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(r.ids).tolist():
            tok, slot = torch.where(r.ids == e)
            w1, w3, w2 = self.experts(e)
            y = expert(x[tok], w1, w3, w2, self.limit, r.weights[tok, slot], self.quant_routed)
            routed.index_add_(0, tok, y.float())
        probes.emit(f"layers.{layer}.ffn.routed.out", routed)
        shared = expert(x, *self.shared, self.limit, None, self.quant_shared)
        probes.emit(f"layers.{layer}.ffn.shared.out", shared)
        out = (routed + shared.float()).to(x.dtype)
        probes.emit(f"layers.{layer}.ffn.out", out)
        return out
