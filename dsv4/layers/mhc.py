"""Manifold-constrained hyper-connections (spec §4) and the final hc_head collapse (§10).

All mixing math in FP32; the streams stay BF16 between sub-blocks. Steps are methods so one
instance can be patched: ``mix`` (RMS-normalized linear map + gates), ``sinkhorn``, ``collapse``,
``post``.
"""
from __future__ import annotations

import torch


def _flat_rms(X: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x̄ = flatten(X)`` in FP32 (stream-major, §4 step 1) and ``rho = 1/sqrt(mean(x̄^2) + eps)``."""
    flat = X.to(torch.float32).flatten(-2)
    return flat, torch.rsqrt(flat.pow(2).mean(dim=-1, keepdim=True) + eps)


class HyperConnection:
    """One sub-block's mHC (``hc_attn_*`` or ``hc_ffn_*``): fn ``[(2+n)n, nD]``, base, scale ``[3]``."""
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *, n: int, iters: int,
                 hc_eps: float, rms_eps: float) -> None:
        self.fn = fn.to(torch.float32)
        self.base = base.to(torch.float32)
        self.scale = scale.to(torch.float32)
        self.n, self.iters, self.hc_eps, self.rms_eps = n, iters, hc_eps, rms_eps

    def mix(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``X [T, n, D]`` -> ``pre [T, n]``, ``post [T, n]``, ``comb [T, n, n]`` (FP32), §4 steps 1-4."""
        n = self.n
        flat, rho = _flat_rms(X, self.rms_eps)
        mu = rho * (flat @ self.fn.T)
        b, s = self.base, self.scale
        pre = torch.sigmoid(s[0] * mu[:, :n] + b[:n]) + self.hc_eps
        post = 2.0 * torch.sigmoid(s[1] * mu[:, n:2 * n] + b[n:2 * n])
        c0 = (s[2] * mu[:, 2 * n:] + b[2 * n:]).unflatten(-1, (n, n))
        return pre, post, self.sinkhorn(c0)

    def sinkhorn(self, c0: torch.Tensor) -> torch.Tensor:
        """Row softmax + eps, column normalization, then (iters-1) x (row, column); ends on a column pass."""
        eps = self.hc_eps
        c = torch.softmax(c0, dim=-1) + eps
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
        for _ in range(self.iters - 1):
            c = c / (c.sum(dim=-1, keepdim=True) + eps)
            c = c / (c.sum(dim=-2, keepdim=True) + eps)
        return c

    def collapse(self, X: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """``x = sum_j pre_j X_j`` over the raw streams, FP32 -> BF16 (§4 step 5)."""
        return torch.einsum("tn,tnd->td", pre, X.to(torch.float32)).to(self.act_dtype)

    def post(self, f: torch.Tensor, X: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """``X'_k = post_k f + sum_j C[j, k] X_j`` in FP32, one cast to BF16 (contracts over the FIRST index)."""
        mixed = torch.einsum("tjk,tjd->tkd", comb, X.to(torch.float32))
        return (post[..., None] * f.to(torch.float32)[:, None, :] + mixed).to(self.act_dtype)


class HCHead:
    """Final collapse: ``pre_j = sigmoid(mu_j * s + b_j) + hc_eps``, no Sinkhorn, no post (§10)."""
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *, hc_eps: float,
                 rms_eps: float) -> None:
        self.fn = fn.to(torch.float32)
        self.base = base.to(torch.float32)
        self.scale = scale.to(torch.float32).reshape(-1)
        self.hc_eps, self.rms_eps = hc_eps, rms_eps

    def weights(self, X: torch.Tensor) -> torch.Tensor:
        flat, rho = _flat_rms(X, self.rms_eps)
        mu = rho * (flat @ self.fn.T)
        return torch.sigmoid(mu * self.scale[0] + self.base) + self.hc_eps

    def collapse(self, X: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        return torch.einsum("tn,tnd->td", pre, X.to(torch.float32)).to(self.act_dtype)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        return self.collapse(X, self.weights(X))
