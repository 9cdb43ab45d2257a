"""Attention (spec §5, §8): sink in the denominator, sliding window, HCA/CSA key sets against a dense
per-query loop, inverse RoPE, grouped output, prefill == chunked == token-by-token."""
from __future__ import annotations

import pytest
import torch

from dsv4.probes import ProbeRecorder

from .helpers import D_MODEL, HEAD_DIM, HEADS, WINDOW, build_attention, new_cache, rand


def test_softmax_with_sink_only_adds_to_the_denominator():
    att = build_attention(0)
    scores = torch.zeros(2, 1, 4)
    valid = torch.tensor([[True, True, True, False]])
    sink = torch.tensor([0.0, 1.5])
    p = att.softmax_with_sink(scores, valid, sink)
    torch.testing.assert_close(p[0, 0, :3], torch.full((3,), 1 / 4.0))
    torch.testing.assert_close(p[1, 0, :3], torch.full((3,), 1 / (3 + torch.e ** 1.5)))
    assert (p[:, 0, 3] == 0).all()
    plain = att.softmax_with_sink(scores, valid, torch.full((2,), -1e30))
    torch.testing.assert_close(plain[:, 0, :3].sum(-1), torch.ones(2))


def _dense_oracle(att, q, raw, raw_pos, entries, sel, positions):
    """Per query, per head, in float64: keys = window rows + the given compressed ids."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for i, t in enumerate(positions.tolist()):
        keys = [raw[r] for r, p in enumerate(raw_pos.tolist()) if t - WINDOW < p <= t]
        keys += [entries[j] for j in sel(i, t)]
        K = torch.stack(keys).double()
        for h in range(HEADS):
            s = (K @ q[i, h].double()) * HEAD_DIM ** -0.5
            e = torch.exp(s - s.max())
            p = e / (e.sum() + torch.exp(att.sink[h].double() - s.max()))
            out[i, h] = p @ K
    return out


@pytest.mark.parametrize("kind", ["window", "hca", "csa"])
def test_attend_matches_a_dense_per_query_loop(kind):
    ratio = {"window": 0, "hca": 8, "csa": 4}[kind]
    att = build_attention(ratio)
    start, T = 11, 9
    positions = torch.arange(start, start + T)
    q = rand(T, HEADS, HEAD_DIM, seed=1).to(torch.bfloat16)
    raw_pos = torch.arange(start - WINDOW + 1, start + T)
    raw = rand(len(raw_pos), HEAD_DIM, seed=2).to(torch.bfloat16)
    entries = rand((start + T) // 4, HEAD_DIM, seed=3).to(torch.bfloat16) if ratio else None
    topk = None
    if kind == "hca":
        sel = lambda i, t: range((t + 1) // 8)
    elif kind == "csa":
        topk = torch.tensor([[0, 2, -1]] * 4 + [[1, 3, 4]] * 5)
        sel = lambda i, t: [j for j in topk[i].tolist() if j >= 0]
    else:
        sel = lambda i, t: []
    got = att.attend(q, raw, raw_pos, entries, topk, positions)
    ref = _dense_oracle(att, q, raw, raw_pos, entries, sel, positions)
    torch.testing.assert_close(got.double(), ref, rtol=2e-2, atol=2e-2)



@pytest.mark.parametrize("start,T", [(0, 1), (3, 1), (40, 1), (0, 300), (17, 600), (5, 257)])
def test_window_bounds_from_the_start_position_equal_the_searchsorted_ones(start, T, monkeypatch):
    """``attend(..., start=)`` takes each query chunk's window bounds from host integers (no host read of
    the positions); with the keys ``window_keys`` returns they are the ``searchsorted`` bounds, bit for bit,
    decode steps and prefill chunks wider than a query chunk alike."""
    import dsv4.layers.attention as A

    monkeypatch.setattr(A, "QUERY_CHUNK", 128)
    att = build_attention(0)
    positions = torch.arange(start, start + T)
    first = max(0, start - WINDOW + 1)
    raw_pos = torch.arange(first, start + T)
    q = rand(T, HEADS, HEAD_DIM, seed=6).to(torch.bfloat16)
    raw = rand(len(raw_pos), HEAD_DIM, seed=7).to(torch.bfloat16)
    want = att.attend(q, raw, raw_pos, None, None, positions)
    assert torch.equal(att.attend(q, raw, raw_pos, None, None, positions, start=start), want)


def test_keys_outside_the_window_do_not_matter():
    att = build_attention(0)
    T = 20
    q = rand(T, HEADS, HEAD_DIM, seed=4).to(torch.bfloat16)
    raw = rand(T, HEAD_DIM, seed=5).to(torch.bfloat16)
    pos = torch.arange(T)
    base = att.attend(q, raw, pos, None, None, pos)
    raw2 = raw.clone()
    raw2[5] += 3.0
    moved = (att.attend(q, raw2, pos, None, None, pos) - base).abs().amax((1, 2)) > 0
    assert moved.tolist() == [5 <= t < 5 + WINDOW for t in range(T)]


@pytest.mark.parametrize("ratio,kv", [(0, "bf16"), (8, "bf16"), (4, "bf16"), (4, "fp8")])
def test_prefill_equals_chunks_equals_token_by_token(ratio, kv):
    att = build_attention(ratio, kv=kv, topk=64)        # topk >= entries: no selection ties between runs
    T = 27
    x = rand(T, D_MODEL, seed=6).to(torch.bfloat16)
    full = att(x, new_cache(), 0)
    cache, parts = new_cache(), []
    for a, b in ((0, 10), (10, 11), *[(p, p + 1) for p in range(11, T)]):
        parts.append(att(x[a:b], cache, a))
    torch.testing.assert_close(torch.cat(parts).float(), full.float(), rtol=2e-2, atol=2e-2)
    assert len(cache.window.recent(100)) == WINDOW


def test_probe_shapes_of_a_csa_layer():
    att = build_attention(4, topk=3)
    T = 10
    with ProbeRecorder() as rec:
        att(rand(T, D_MODEL, seed=8).to(torch.bfloat16), new_cache(), 0)
    assert rec["layers.1.attn.q"].shape == (T, HEADS, HEAD_DIM)
    assert rec["layers.1.attn.kv"].shape == (T, HEAD_DIM)
    assert rec["layers.1.attn.compressed_kv"].shape == (T // 4, HEAD_DIM)
    assert rec["layers.1.attn.indexer.scores"].shape == (T, T // 4)
    topk = rec["layers.1.attn.indexer.topk"]
    assert topk.shape == (T, 2) and topk.dtype == torch.int64
    assert topk[:3].eq(-1).all() and topk[3:7].tolist() == [[0, -1]] * 4 and topk[7:].tolist() == [[0, 1]] * 3
    assert rec["layers.1.attn.core"].shape == (T, HEADS, HEAD_DIM)
    assert rec["layers.1.attn.out"].shape == (T, D_MODEL)


def test_core_is_inverse_rotated_and_output_is_grouped():
    att = build_attention(0)
    T = 5
    with ProbeRecorder() as rec:
        out = att(rand(T, D_MODEL, seed=9).to(torch.bfloat16), new_cache(), 0)
    pos = torch.arange(T)
    q = att.rope.apply(rec["layers.1.attn.q"], pos)
    kv = att.rope.apply(rec["layers.1.attn.kv"], pos)
    o = att.attend(q, kv, pos, None, None, pos)
    core = rec["layers.1.attn.core"]
    torch.testing.assert_close(core, att.rope.apply(o, pos, inverse=True))
    assert not torch.allclose(core[1:, :, -64:].float(), o[1:, :, -64:].float(), atol=1e-2)
    w_oa = att.wo_a.weight.weight.float()                    # [G, R, H*d/G]: group g = heads g*H/G..
    z = torch.einsum("tgi,gri->tgr", core.float().reshape(T, 2, -1), w_oa).to(torch.bfloat16)
    ref = z.reshape(T, -1).float() @ att.wo_b.weight.weight.float().T
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
