"""Sparse attention with sink over the window + compressed key set (spec §5 step 5, §8)."""
from __future__ import annotations

import math

import torch

from reference.attention import sparse_attention, update_ring, window_keys
from reference.state import LayerCache


def naive(q, keys, key0, comp, mask, positions, window, sink, scale):
    """Per query and head: gather the key list, softmax with exp(sink) in the denominator."""
    T, H, d = q.shape
    out = torch.zeros(T, H, d)
    for i, p in enumerate(positions.tolist()):
        rows = [keys[k - key0] for k in range(max(p - window + 1, key0), p + 1)]
        rows += [comp[j] for j in range(comp.shape[0]) if mask[i, j]]
        kv = torch.stack(rows)
        for h in range(H):
            s = (kv @ q[i, h]) * scale
            e = torch.exp(s - s.max())
            p_ = e / (e.sum() + math.exp(sink[h] - s.max()))
            out[i, h] = p_ @ kv
    return out


def test_matches_a_per_query_loop() -> None:
    g = torch.Generator().manual_seed(0)
    T, H, d, W, N = 11, 3, 8, 4, 5
    q, keys, comp = torch.randn(T, H, d, generator=g), torch.randn(T, d, generator=g), torch.randn(N, d, generator=g)
    mask = torch.rand(T, N, generator=g) > 0.5
    sink = torch.randn(H, generator=g)
    pos = torch.arange(T)
    got = sparse_attention(q, keys, 0, comp, mask, pos, W, sink, d ** -0.5)
    assert torch.allclose(got, naive(q, keys, 0, comp, mask, pos, W, sink, d ** -0.5), atol=1e-5)
    # a later chunk whose window reaches into earlier rows (decode-like: key rows start before the queries)
    got = sparse_attention(q[7:], keys[4:], 4, comp, mask[7:], pos[7:], W, sink, d ** -0.5)
    assert torch.allclose(got, naive(q[7:], keys[4:], 4, comp, mask[7:], pos[7:], W, sink, d ** -0.5), atol=1e-5)


def test_sink_is_only_in_the_denominator() -> None:
    q, k = torch.tensor([[[1.0, 0.0]]]), torch.tensor([[2.0, 3.0]])
    a = torch.tensor([0.5])
    out = sparse_attention(q, k, 0, None, None, torch.tensor([0]), 4, a, 1.0)
    s = 2.0   # one key: o = v · e^s / (e^s + e^a)
    assert torch.allclose(out[0, 0], k[0] * math.exp(s) / (math.exp(s) + math.exp(0.5)), atol=1e-6)
    plain = sparse_attention(q, k, 0, None, None, torch.tensor([0]), 4, torch.tensor([-float("inf")]), 1.0)
    assert torch.allclose(plain[0, 0], k[0])


def test_window_boundary() -> None:
    """The window of t is {t−W+1, …, t}: W keys including the query's own position."""
    W, d = 3, 4
    keys = torch.zeros(6, d)
    keys[2] = torch.tensor([0.0, 0.0, 0.0, 50.0])      # position 2: inside t=4's window, outside t=5's
    q = torch.tensor([0.0, 0.0, 0.0, 1.0]).expand(6, 1, d).contiguous()
    out = sparse_attention(q, keys, 0, None, None, torch.arange(6), W, torch.tensor([-float("inf")]), 1.0)
    assert out[4, 0, 3] > 49.0 and out[5, 0, 3] == 0.0


def test_ring_serves_the_last_window_positions() -> None:
    cache, W = LayerCache(), 4
    rows = torch.arange(10.0).unsqueeze(1).expand(10, 2)
    update_ring(cache, rows[:7], 0, W)                   # prefill 0..6
    keys, key0 = window_keys(cache, rows[7:8], 7, W)      # decode position 7
    assert key0 == 4 and keys[:, 0].tolist() == [4.0, 5.0, 6.0, 7.0]
    update_ring(cache, rows[7:8], 7, W)
    keys, key0 = window_keys(cache, rows[8:10], 8, W)     # a 2-token chunk at 8
    assert key0 == 5 and keys[:, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
