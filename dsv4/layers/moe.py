"""Routed MoE (spec §9): router, one grouped GEMM over the experts for w13 (fused SwiGLU epilogue on
FP4) and one for w2, the routing weight multiplied into the SwiGLU output before w2 (where the
official Expert applies it) in FP32, and an FP32 sum over every (token, slot) pair; then + shared
expert in FP32, one cast to BF16.

Rows of the grouped GEMMs are the (token, slot) pairs sorted by expert (stable), so expert e owns
rows ``offsets[e]:offsets[e+1]``; experts nobody chose are empty groups.
"""
from __future__ import annotations

import torch

from .. import probes
from .grouped_linear import GroupedLinear, group_offsets
from .norm import NormedInput, take_rows
from .router import Router
from .shared_expert import SharedExpert
from .swiglu import clamped_swiglu, overridden


class MoE:
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, prefix: str, router: Router, w13: GroupedLinear, w2: GroupedLinear, shared: SharedExpert,
                 *, n_experts: int, swiglu_limit: float) -> None:
        self.prefix = prefix
        self.router = router
        self.w13, self.w2 = w13, w2
        self.shared = shared
        self.n_experts = n_experts
        self.swiglu_limit = float(swiglu_limit)
        self.inter = w13.n_per_group // 2

    def swiglu(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(g, u, self.swiglu_limit)

    def fused(self) -> bool:
        return self.w13.fuses_swiglu and not overridden(self, "swiglu", MoE.swiglu)

    def dispatch(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``ids [T, k]`` -> (row order into the flattened pairs, token of each row, int32 offsets [E+1])."""
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        # counted by a scatter, not torch.bincount: on CUDA bincount reads the ids' maximum on the host, a
        # synchronization every layer of every decode step (integer adds: deterministic in any order)
        counts = torch.zeros(self.n_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
        return order, order // ids.shape[1], group_offsets(counts)

    def apply_route_weight(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """FP32 ``w * a`` cast to BF16: the input of w2 (official Expert.forward)."""
        return (a.to(torch.float32) * w[:, None]).to(self.act_dtype)

    def expert_activation(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor) -> torch.Tensor:
        if self.fused():
            return self.w13(x, offsets, swiglu_limit=self.swiglu_limit)
        h = self.w13(x, offsets)
        return self.swiglu(h[:, :self.inter], h[:, self.inter:])

    def combine(self, y: torch.Tensor, order: torch.Tensor, T: int) -> torch.Tensor:
        """Sum each (token, slot) row into its token, FP32 ``[T, D]`` (duplicates counted every time).
        Rows come sorted by expert (``order``); summing in slot order keeps the result deterministic
        on CUDA, where ``index_add_``'s atomic adds vary run to run once top-k > 2."""
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        return y[inv].to(torch.float32).view(T, order.numel() // max(T, 1), -1).sum(dim=1)

    def routed(self, x: torch.Tensor | NormedInput, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        order, token, offsets = self.dispatch(ids)
        a = self.expert_activation(take_rows(x, token), offsets)
        a = self.apply_route_weight(a, weights.reshape(-1)[order])
        return self.combine(self.w2(a, offsets), order, ids.shape[0])

    def __call__(self, x: torch.Tensor | NormedInput, token_ids: torch.Tensor) -> torch.Tensor:
        ids, weights = self.router(x, token_ids)
        routed = self.routed(x, ids, weights)
        probes.emit(self.prefix + "ffn.routed.out", routed)
        shared = self.shared(x)
        probes.emit(self.prefix + "ffn.shared.out", shared)
        out = (routed + shared.to(torch.float32)).to(self.act_dtype)
        probes.emit(self.prefix + "ffn.out", out)
        return out
