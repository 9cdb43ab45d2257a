"""MoE (spec §9): clamp order, sqrt-softplus routing with selection-only bias, hash routing by token
id, (token, slot) sums, and reading only the experts some token selected."""
from __future__ import annotations


import torch
import torch.nn.functional as F

from dsv4 import probes
from dsv4.checkpoint.reader import open_checkpoint
from reference.moe import MoE, expert, route, swiglu


def test_clamp_order_beyond_the_limit() -> None:
    g = torch.tensor([20.0, -20.0, 5.0, 20.0])
    u = torch.tensor([20.0, -20.0, 3.0, -20.0])
    out = swiglu(g, u, 10.0)
    want = [F.silu(torch.tensor(10.0)) * 10, F.silu(torch.tensor(-20.0)) * -10, F.silu(torch.tensor(5.0)) * 3,
            F.silu(torch.tensor(10.0)) * -10]
    assert torch.allclose(out, torch.stack(want))        # gate: upper bound only; up: both sides
    assert torch.allclose(swiglu(g, u, 0.0), F.silu(g) * u)  # limit 0 disables the clamp (OFF-M)


def test_routing_bias_selects_but_does_not_weight() -> None:
    gate = torch.eye(4)                                   # logits = x
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    bias = torch.tensor([0.0, 0.0, 5.0, 0.0])            # pushes expert 2 into the top-2
    logits, r = route(x, gate, bias, None, torch.tensor([0]), 2, 1.5)
    s = F.softplus(x).sqrt()
    assert torch.equal(logits, x) and r.ids.tolist() == [[2, 0]]
    want = torch.stack([s[0, 2], s[0, 0]]) / (s[0, 2] + s[0, 0]) * 1.5
    assert torch.allclose(r.weights[0], want)


def test_hash_routing_uses_the_token_id() -> None:
    gate = torch.eye(4)
    tid2eid = torch.tensor([[3, 1], [0, 2]])
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    _, r = route(x, gate, None, tid2eid, torch.tensor([1, 0]), 2, 2.0)
    assert r.ids.tolist() == [[0, 2], [3, 1]]
    s = F.softplus(x[0]).sqrt()
    assert torch.allclose(r.weights[1], torch.stack([s[3], s[1]]) / (s[3] + s[1]) * 2.0)


def test_each_token_slot_pair_counts_and_only_selected_experts_are_read() -> None:
    g = torch.Generator().manual_seed(0)
    D, I, E = 8, 16, 6
    ws = {e: (torch.randn(I, D, generator=g), torch.randn(I, D, generator=g), torch.randn(D, I, generator=g))
          for e in range(E)}
    shared = (torch.randn(I, D, generator=g), torch.randn(I, D, generator=g), torch.randn(D, I, generator=g))
    reads: list[int] = []

    def experts(e: int):
        reads.append(e)
        return ws[e]

    tid2eid = torch.tensor([[4, 4], [1, 4], [1, 2]])      # row 0 repeats expert 4
    moe = MoE(torch.randn(E, D, generator=g), None, tid2eid, experts, shared, k=2, scale=1.5, limit=2.0,
              quant_routed=False, quant_shared=False)
    x = torch.randn(2, D, generator=g)
    ids = torch.tensor([0, 1])
    with probes.ProbeRecorder() as rec:
        out = moe(x, ids, 0)
    assert sorted(reads) == [1, 4]                          # expert 2 (only in row 2, unused) never read
    _, r = route(x, moe.gate, None, tid2eid, ids, 2, 1.5)
    want = torch.zeros(2, D)
    for t in range(2):
        for slot in range(2):
            want[t] += expert(x[t:t + 1], *ws[int(r.ids[t, slot])], 2.0, r.weights[t, slot:slot + 1], False)[0]
    assert torch.allclose(rec["layers.0.ffn.routed.out"], want, atol=1e-5)
    assert torch.allclose(out, want + expert(x, *shared, 2.0, None, False), atol=1e-5)


def test_model_hash_layers_route_by_token_id(tiny_model, tiny_path, make_ids) -> None:
    m, ids = tiny_model(), make_ids(40, seed=5)
    with probes.ProbeRecorder() as rec:
        m(ids)
    reader = open_checkpoint(tiny_path)
    c = m.config
    for i in range(c.num_hidden_layers):
        got = rec[f"layers.{i}.ffn.router.topk_ids"]
        if c.is_hash_layer(i):
            assert torch.equal(got, reader.weight("ffn.gate.tid2eid", i).tensors["weight"][ids].long())
        else:
            logits = rec[f"layers.{i}.ffn.router.logits"]
            bias = reader.weight("ffn.gate.bias", i).tensors["weight"]
            assert torch.equal(got, (F.softplus(logits).sqrt() + bias).topk(c.num_experts_per_tok).indices)
        w = rec[f"layers.{i}.ffn.router.weights"]
        assert torch.allclose(w.sum(-1), torch.full((40,), c.routed_scaling_factor), atol=1e-5)


def test_model_clamps_routed_and_shared_experts(tiny_with, make_ids) -> None:
    """With a small limit (the tiny checkpoint's pre-activations barely reach 10) the layer outputs
    are the clamped SwiGLU of §9 in both the routed and the shared experts."""
    from reference.ops import rms_norm
    from reference.weights import LayerWeights

    ids = make_ids(24, seed=2)
    outs = {}
    for limit in (3.0, 0.0):
        m = tiny_with(swiglu_limit=limit)
        with probes.ProbeRecorder() as rec:
            m(ids)
        lw = LayerWeights(m.store, 2, "cpu")
        x = rms_norm(rec["layers.2.hc.ffn.pre"], lw("ffn_norm", True), m.config.rms_norm_eps)
        shared = [lw(f"ffn.shared_experts.{w}") for w in ("w1", "w3", "w2")]
        assert torch.allclose(rec["layers.2.ffn.shared.out"], expert(x, *shared, limit, None, False), atol=1e-5)
        routed = torch.zeros_like(x)
        ids_, wts = rec["layers.2.ffn.router.topk_ids"], rec["layers.2.ffn.router.weights"]
        for t in range(24):
            for s in range(2):
                e = int(ids_[t, s])
                w = [lw(f"ffn.experts.{e}.{n}") for n in ("w1", "w3", "w2")]
                routed[t] += expert(x[t:t + 1], *w, limit, wts[t, s:s + 1], False)[0]
        assert torch.allclose(rec["layers.2.ffn.routed.out"], routed, atol=1e-4)
        outs[limit] = rec["layers.2.ffn.out"]
    assert not torch.allclose(outs[3.0], outs[0.0], atol=1e-2)   # the clamp is active at L = 3
