"""Manifold-constrained hyper-connections (spec §4) and the final hc_head collapse (§10).

Everything here yields fp32 (§12: mHC is an fp32 island; sums accumulate in fp64, reference/ops.py);
collapsed and mixed streams are cast to the activation dtype once, at the end (§4 "HC_post dtype",
§16 item 14)."""
from __future__ import annotations

import torch

from .ops import ACC, mm, sigmoid


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """§4 step 4 / §16 item 13: softmax over each row + eps, a column pass, then iters−1 × (row, column).
    Ends with a column pass: column sums are 1 up to eps, rows are not renormalized."""
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def _mixes(x: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """§4 steps 1-2: flatten stream-major; μ = ρ · F x̄ with ρ = 1/√(mean(x̄²)+rms_eps), fp32 result
    (accumulated in fp64, reference/ops.py)."""
    flat = x.flatten(-2).to(ACC)
    rho = torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)
    return (mm(flat, fn.T) * rho).float()


def hc_pre(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *, n: int,
           iters: int, hc_eps: float, rms_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """§4 HC_pre. x: streams [T, n, D]. Returns the collapsed stream [T, D] (activation dtype),
    post [T, n] and comb [T, n, n] (fp32)."""
    mu = _mixes(x, fn, rms_eps)
    base, scale = base.float(), scale.float()
    pre = sigmoid(mu[:, :n] * scale[0] + base[:n]) + hc_eps
    post = 2 * sigmoid(mu[:, n:2 * n] * scale[1] + base[n:2 * n])
    comb0 = (mu[:, 2 * n:] * scale[2] + base[2 * n:]).view(-1, n, n)   # C0[j, k] row-major
    comb = sinkhorn(comb0.to(ACC), iters, hc_eps).float()
    collapsed = (pre.to(ACC).unsqueeze(-1) * x.to(ACC)).sum(dim=1)      # §4 step 5: over raw streams
    return collapsed.float().to(x.dtype), post, comb


def hc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """§4 HC_post: X'_k = post_k · f + Σ_j C[j,k] · X_j (contraction over the FIRST index), fp32, cast once."""
    mixed = torch.einsum("tjk,tjd->tkd", comb.to(ACC), x.to(ACC))
    return (post.to(ACC).unsqueeze(-1) * f.to(ACC).unsqueeze(1) + mixed).float().to(x.dtype)


def hc_head(x: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *, hc_eps: float,
            rms_eps: float) -> torch.Tensor:
    """§10: pre_j = σ(μ_j · s_h + b_h,j) + hc_eps; y = Σ_j pre_j X_j (no Sinkhorn, no post)."""
    mu = _mixes(x, fn, rms_eps)
    pre = sigmoid(mu * scale.float().reshape(()) + base.float()) + hc_eps
    return (pre.to(ACC).unsqueeze(-1) * x.to(ACC)).sum(dim=1).float().to(x.dtype)
