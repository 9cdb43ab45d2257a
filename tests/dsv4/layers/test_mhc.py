"""mHC (spec §4): Sinkhorn order, post-mixing over the FIRST index, collapse; hc_head (§10)."""
from __future__ import annotations

import torch

from dsv4.layers.mhc import HCHead, HyperConnection

from .helpers import rand

n, D, T = 4, 16, 3


def _hc(iters: int = 20) -> HyperConnection:
    return HyperConnection(rand(24, n * D, seed=1) * 0.2, rand(24, seed=2), torch.tensor([0.5, 0.4, 0.3]), n=n,
                           iters=iters, hc_eps=1e-6, rms_eps=1e-6)


def test_sinkhorn_order_ends_on_a_column_pass():
    hc = _hc(iters=3)
    c0 = rand(2, n, n, seed=3) * 2
    c = torch.softmax(c0, -1) + 1e-6
    c = c / (c.sum(-2, keepdim=True) + 1e-6)
    for _ in range(2):
        c = c / (c.sum(-1, keepdim=True) + 1e-6)
        c = c / (c.sum(-2, keepdim=True) + 1e-6)
    torch.testing.assert_close(hc.sinkhorn(c0), c)
    torch.testing.assert_close(_hc().sinkhorn(c0).sum(-2), torch.ones(2, n), rtol=1e-5, atol=1e-5)


def test_mix_gates_and_post_contracts_over_the_first_index():
    hc = _hc()
    X = rand(T, n, D, seed=4).to(torch.bfloat16)
    pre, post, comb = hc.mix(X)
    assert ((pre > 0) & (pre < 1 + 1e-5)).all() and ((post > 0) & (post < 2)).all()
    comb = torch.zeros(T, n, n)
    comb[:, 0, 1] = 1.0                       # C[j=0, k=1]: stream 0 feeds output stream 1
    f = torch.zeros(T, D, dtype=torch.bfloat16)
    out = hc.post(f, X, post, comb)
    assert torch.equal(out[:, 1], X[:, 0]) and (out[:, 0] == 0).all()


def test_collapse_and_head_weights():
    X = rand(T, n, D, seed=5).to(torch.bfloat16)
    hc = _hc()
    pre = torch.rand(T, n)
    torch.testing.assert_close(hc.collapse(X, pre).float(), (pre[..., None] * X.float()).sum(1), rtol=1e-2,
                               atol=1e-2)
    head = HCHead(rand(n, n * D, seed=6) * 0.1, rand(n, seed=7), torch.tensor([0.4]), hc_eps=1e-6, rms_eps=1e-6)
    flat = X.float().flatten(1)
    mu = flat @ head.fn.T * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(head.weights(X), torch.sigmoid(mu * 0.4 + head.base) + 1e-6)
