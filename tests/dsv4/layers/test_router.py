"""Router (spec §9 steps 1-4): sqrt-softplus, bias for selection only, renormalization, hash routing."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.layers.router import HashRouter, Router

from .helpers import make_linear, rand

E, D, T, K = 8, 128, 6, 2


def _gate() -> object:
    return make_linear([rand(E, D, seed=11, scale=D ** -0.5)], "bf16", component="router", out_dtype=torch.float32)


def test_logits_are_fp32_and_scores_are_sqrt_softplus():
    r = Router("layers.3.", _gate(), topk=K, route_scale=1.5, bias=None)
    x = rand(T, D, seed=1).to(torch.bfloat16)
    logits = r.logits(x)
    assert logits.dtype == torch.float32
    l = torch.tensor([-30.0, -1.0, 0.0, 2.0, 25.0])
    torch.testing.assert_close(r.score(l), torch.sqrt(torch.log1p(torch.exp(l.double()))).float(), rtol=1e-6,
                               atol=1e-7)


def test_bias_changes_selection_but_not_weights():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]])
    bias = torch.zeros(E)
    bias[6] = 10.0                       # pulls expert 6 into the top-2
    r = Router("layers.3.", _gate(), topk=K, route_scale=1.5, bias=bias)
    ids, w = r.route(logits, torch.zeros(1, dtype=torch.long))
    assert ids.tolist() == [[6, 0]]      # biased score order
    s = torch.sqrt(F.softplus(logits))[0]
    expect = torch.stack([s[6], s[0]]) / (s[6] + s[0]) * 1.5   # unbiased scores
    torch.testing.assert_close(w[0], expect)
    assert float(w.sum()) == torch.tensor(1.5).item() or abs(float(w.sum()) - 1.5) < 1e-6


def test_no_bias_is_plain_topk_of_scores():
    r = Router("layers.3.", _gate(), topk=K, route_scale=1.0, bias=None)
    logits = rand(T, E, seed=3)
    ids, w = r.route(logits, torch.zeros(T, dtype=torch.long))
    assert torch.equal(ids, torch.sqrt(F.softplus(logits)).topk(K).indices)
    torch.testing.assert_close(w.sum(-1), torch.ones(T))


def test_hash_routing_uses_tid2eid_and_renormalizes_gathered_scores():
    tid2eid = torch.tensor([[1, 5], [7, 0], [2, 3]])
    r = HashRouter("layers.0.", _gate(), topk=K, route_scale=2.0, tid2eid=tid2eid)
    logits = rand(3, E, seed=4)
    tokens = torch.tensor([2, 0, 1])
    ids, w = r.route(logits, tokens)
    assert ids.tolist() == [[2, 3], [1, 5], [7, 0]]
    s = torch.sqrt(F.softplus(logits))
    g = s.gather(1, ids)
    torch.testing.assert_close(w, g / g.sum(-1, keepdim=True) * 2.0)
