"""mHC (spec §4) and hc_head (§10) against hand-computed cases and invariants."""
from __future__ import annotations

import torch

from reference.mhc import hc_head, hc_post, hc_pre, sinkhorn

EPS = 1e-6


def test_sinkhorn_column_sums_are_one() -> None:
    c = sinkhorn(torch.randn(50, 4, 4, generator=torch.Generator().manual_seed(0)) * 3, 20, EPS)
    assert torch.allclose(c.sum(dim=-2), torch.ones(50, 4), atol=1e-5)
    assert bool((c > 0).all())


def test_sinkhorn_order_by_hand() -> None:
    """§16 item 13: softmax(row)+eps, column pass, then (t−1) × (row, column); no final row pass."""
    logits = torch.tensor([[[2.0, 0.0], [0.0, -1.0]]])
    c = torch.softmax(logits, -1) + EPS
    c1 = c / (c.sum(-2, keepdim=True) + EPS)
    assert torch.allclose(sinkhorn(logits, 1, EPS), c1, atol=1e-7)
    c2 = c1 / (c1.sum(-1, keepdim=True) + EPS)
    c2 = c2 / (c2.sum(-2, keepdim=True) + EPS)
    assert torch.allclose(sinkhorn(logits, 2, EPS), c2, atol=1e-7)
    # after one iteration the rows are visibly not normalized: the last pass is a column pass
    assert (sinkhorn(logits, 1, EPS).sum(-1) - 1).abs().max() > 0.05


def test_hc_post_contracts_over_the_first_index() -> None:
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])          # streams X_0 = e0, X_1 = e1   [T=1, n=2, D=2]
    comb = torch.tensor([[[0.9, 0.3], [0.1, 0.7]]])       # not symmetric
    post = torch.tensor([[0.5, 2.0]])
    f = torch.tensor([[10.0, 20.0]])
    out = hc_post(f, x, post, comb)
    # X'_k = post_k f + Σ_j C[j,k] X_j: X'_0 = 0.5 f + 0.9 e0 + 0.1 e1
    assert torch.allclose(out[0, 0], torch.tensor([5.9, 10.1]))
    assert torch.allclose(out[0, 1], torch.tensor([20.3, 40.7]))


def test_hc_pre_by_hand() -> None:
    n, D = 2, 2
    x = torch.tensor([[[1.0, 2.0], [3.0, -1.0]]])
    fn = torch.randn((2 + n) * n, n * D, generator=torch.Generator().manual_seed(1))
    scale = torch.tensor([0.5, 0.7, 1.3])
    base = torch.randn((2 + n) * n, generator=torch.Generator().manual_seed(2))
    h, post, comb = hc_pre(x, fn, scale, base, n=n, iters=3, hc_eps=EPS, rms_eps=1e-6)
    flat = x.reshape(1, -1)                                   # stream-major: [X_0 | X_1]
    mu = (flat @ fn.T) / torch.sqrt(flat.square().mean() + 1e-6)
    pre = torch.sigmoid(mu[:, :n] * 0.5 + base[:n]) + EPS
    assert torch.allclose(h, pre[0, 0] * x[:, 0] + pre[0, 1] * x[:, 1], atol=1e-6)
    assert torch.allclose(post, 2 * torch.sigmoid(mu[:, n:2 * n] * 0.7 + base[n:2 * n]), atol=1e-6)
    want = sinkhorn((mu[:, 2 * n:] * 1.3 + base[2 * n:]).view(1, n, n), 3, EPS)   # row-major C0[j, k]
    assert torch.allclose(comb, want, atol=1e-6)
    assert h.dtype == x.dtype and post.dtype == torch.float32


def test_hc_post_casts_once() -> None:
    """HC_post is evaluated in fp32 and rounded to bf16 once (§4 "HC_post dtype")."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 4, 64, generator=g).to(torch.bfloat16)
    f = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    post, comb = torch.rand(5, 4, generator=g) * 2, sinkhorn(torch.randn(5, 4, 4, generator=g), 20, EPS)
    exact = (post.unsqueeze(-1) * f.float().unsqueeze(1) + torch.einsum("tjk,tjd->tkd", comb, x.float()))
    assert torch.equal(hc_post(f, x, post, comb), exact.to(torch.bfloat16))


def test_hc_head_by_hand() -> None:
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(4))
    fn, base, scale = torch.randn(4, 32), torch.randn(4), torch.tensor([0.6])
    flat = x.reshape(3, -1)
    mu = (flat @ fn.T) / torch.sqrt(flat.square().mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mu * 0.6 + base) + EPS
    want = (pre.unsqueeze(-1) * x).sum(1)
    assert torch.allclose(hc_head(x, fn, scale, base, hc_eps=EPS, rms_eps=1e-6), want, atol=1e-5)
