"""The clamped SwiGLU of every expert, routed and shared (spec §9 step 5)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def clamped_swiglu(g: torch.Tensor, u: torch.Tensor, limit: float) -> torch.Tensor:
    """FP32 ``silu(min(g, L)) * clamp(u, -L, L)``: both clamps act on the raw projections BEFORE the
    SiLU (the gate from above only), so the sigmoid reads the clamped gate."""
    g = torch.clamp(g.to(torch.float32), max=limit)
    u = torch.clamp(u.to(torch.float32), min=-limit, max=limit)
    return F.silu(g) * u


def overridden(obj: object, method: str, stock: object) -> bool:
    """True when ``obj.method`` is not the stock implementation (a fault patched into the instance or
    its class). A fused kernel epilogue cannot run a patched Python method, so callers then take the
    unfused path, which calls it."""
    return method in vars(obj) or getattr(type(obj), method) is not stock
