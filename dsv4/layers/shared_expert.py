"""Shared expert (spec §9 step 6): the same clamped SwiGLU as the routed experts, width I.

``w13`` is one linear over the stacked ``[w1; w3]`` rows. With an FP4 plan the backend applies the
SwiGLU in the GEMM epilogue (contract GemmRequest.swiglu_limit); otherwise ``swiglu`` runs in FP32 on
the BF16 projections, as the official Expert does. A patched ``swiglu`` always runs (unfused).
"""
from __future__ import annotations

import torch

from .linear import Linear
from .norm import NormedInput
from .swiglu import clamped_swiglu, overridden


class SharedExpert:
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, name: str, w13: Linear, w2: Linear, *, swiglu_limit: float) -> None:
        self.name = name
        self.w13, self.w2 = w13, w2
        self.swiglu_limit = float(swiglu_limit)
        self.inter = w13.out_features // 2

    def swiglu(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return clamped_swiglu(g, u, self.swiglu_limit)

    def fused(self) -> bool:
        return self.w13.fuses_swiglu and not overridden(self, "swiglu", SharedExpert.swiglu)

    def activation(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        """``silu(min(w1 x, L)) * clamp(w3 x, -L, L)`` -> BF16 ``[T, I]`` (the input of w2)."""
        if self.fused():
            return self.w13(x, swiglu_limit=self.swiglu_limit)
        h = self.w13(x)
        return self.swiglu(h[:, :self.inter], h[:, self.inter:]).to(self.act_dtype)

    def __call__(self, x: torch.Tensor | NormedInput) -> torch.Tensor:
        return self.w2(self.activation(x))
