"""Compressor (spec §6): bias on the gate logits only, convex pooling, causality, CSA overlap,
entry 0, RoPE at j*m, streaming == one-shot."""
from __future__ import annotations

import torch

from dsv4.layers.kv_cache import CompressorState

from .helpers import D_MODEL, build_compressor, rand

T = 24


def test_pool_is_convex_and_the_ape_never_reaches_the_content():
    comp = build_compressor(4, False, 8)
    kv = rand(3, 4, 8, seed=1)
    gate = rand(3, 4, 8, seed=2)
    ape = rand(4, 8, seed=3) * 50
    out = comp.pool(kv, gate, ape)
    assert ((out <= kv.amax(1) + 1e-6) & (out >= kv.amin(1) - 1e-6)).all()
    assert comp.pool(torch.zeros_like(kv), gate, ape).abs().max() == 0     # a bias on C would leak here
    same = kv[:, :1].expand_as(kv)
    torch.testing.assert_close(comp.pool(same, gate, ape), kv[:, 0])


def _entries(comp, x):
    return comp(x, CompressorState(), 0)[0]


def test_causality_entry_j_only_sees_tokens_up_to_its_block_end():
    for ratio, overlap in ((4, True), (8, False)):
        comp = build_compressor(ratio, overlap, 128)
        x = rand(T, D_MODEL, seed=5).to(torch.bfloat16)
        base = _entries(comp, x)
        assert base.shape == (T // ratio, 128)
        p = 13
        x2 = x.clone()
        x2[p] += 1.0
        moved = (_entries(comp, x2) - base).abs().amax(-1) > 0
        first = p // ratio                          # block holding p
        last = first + (1 if overlap else 0)        # CSA: entry j also pools block j-1
        expect = torch.zeros(T // ratio, dtype=torch.bool)
        expect[first:min(last, T // ratio - 1) + 1] = True
        assert torch.equal(moved, expect), (ratio, moved, expect)


def test_csa_entry0_has_no_previous_block_and_rope_is_at_block_start():
    comp = build_compressor(4, True, 128)
    x = rand(8, D_MODEL, seed=6).to(torch.bfloat16)
    kv, gate = comp.project(x)
    c = 128
    w = torch.softmax(gate[:4, c:] + comp.ape[:, c:], dim=0)           # only block 0's b-half
    e0 = comp.norm((w * kv[:4, c:]).sum(0).to(torch.bfloat16)[None])
    w1 = torch.softmax(torch.cat([gate[:4, :c] + comp.ape[:, :c], gate[4:8, c:] + comp.ape[:, c:]]), dim=0)
    e1 = comp.norm((w1 * torch.cat([kv[:4, :c], kv[4:8, c:]])).sum(0).to(torch.bfloat16)[None])
    out = _entries(comp, x)
    torch.testing.assert_close(out[0:1], comp.rope.apply(e0, torch.tensor([0])))
    torch.testing.assert_close(out[1:2], comp.rope.apply(e1, torch.tensor([4])))


def test_streaming_token_by_token_equals_one_shot():
    for ratio, overlap in ((4, True), (8, False)):
        comp = build_compressor(ratio, overlap, 128)
        x = rand(T + 3, D_MODEL, seed=7).to(torch.bfloat16)
        one = _entries(comp, x)
        st, got = CompressorState(), []
        for a, b in ((0, 5), (5, 6), (6, 17), *[(p, p + 1) for p in range(17, T + 3)]):
            got.append(comp(x[a:b], st, a)[0])
        torch.testing.assert_close(torch.cat(got), one, rtol=1e-2, atol=1e-2)
        assert st.entries == (T + 3) // ratio and st.tail_kv.shape[0] == (T + 3) % ratio
