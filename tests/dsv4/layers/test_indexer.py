"""Lightning indexer (spec §7): score formula, causal mask, top-k with -1 and ascending ids,
QK treatment (Hadamard + FP4 fake quantization) from the plan."""
from __future__ import annotations

import torch

from dsv4.layers.indexer import QK_TREATMENTS
from dsv4.numerics import fp4_fake_quantize_pow2, hadamard_transform
from dsv4.plan import INDEXER_QK_TREATMENT

from .helpers import build_attention, rand


def test_scores_are_weighted_relu_dot_products():
    ix = build_attention(4).indexer
    q, keys, w = rand(3, 2, 128, seed=1), rand(5, 128, seed=2), rand(3, 2, seed=3)
    ref = torch.zeros(3, 5, dtype=torch.float64)
    for t in range(3):
        for j in range(5):
            ref[t, j] = sum(float(w[t, h]) * max(0.0, float(q[t, h].double() @ keys[j].double())) for h in range(2))
    torch.testing.assert_close(ix.scores(q, keys, w).double(), ref, rtol=1e-5, atol=1e-4)


def test_head_weights_use_indexer_sizes():
    ix = build_attention(4).indexer
    x = rand(4, 128, seed=4).to(torch.bfloat16)
    torch.testing.assert_close(ix.head_weights(x), ix.weights_proj(x) * (128 ** -0.5 * 2 ** -0.5))


def test_mask_and_select_give_ascending_valid_ids_then_minus_one():
    ix = build_attention(4, topk=3).indexer
    positions = torch.tensor([2, 5, 9, 15])
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0]] * 4)
    masked = ix.causal_mask(scores, positions)
    assert torch.isinf(masked[0]).all() and torch.isfinite(masked[3]).all()
    sel = ix.select(masked, positions)
    assert sel.tolist() == [[-1, -1, -1], [0, -1, -1], [0, 1, -1], [0, 1, 2]]
    assert ix.select(masked[:, :2], positions).shape == (4, 2)     # k = min(index_topk, N)


def test_qk_treatment_comes_from_the_plan():
    x = rand(3, 2, 128, seed=5).to(torch.bfloat16)
    assert INDEXER_QK_TREATMENT == {"fp4": "hadamard+fp4", "fp8": "hadamard+fp4", "bf16": "none",
                                    "fp32": "none"}
    torch.testing.assert_close(QK_TREATMENTS["hadamard+fp4"](x), fp4_fake_quantize_pow2(hadamard_transform(x), 32))
    assert torch.equal(QK_TREATMENTS["none"](x), x)
    ix = build_attention(4, qk="hadamard+fp4").indexer
    assert not torch.equal(ix.rotate_quantize(x), x)


def test_scores_in_query_chunks_equal_the_whole_and_bound_the_dot_products(monkeypatch):
    """A 32k Flash prefill's [T, Hi, N] dot products are 69 GB at once: the scores are made in query chunks
    of at most SCORE_ELEMENTS products, each row's arithmetic unchanged."""
    import dsv4.layers.indexer as indexer_mod
    ix = build_attention(4).indexer
    q, keys, w = rand(37, 2, 128, seed=6), rand(11, 128, seed=7), rand(37, 2, seed=8)
    whole = ix.scores(q, keys, w)
    seen = []
    real_einsum = torch.einsum

    def spy(eq, *ops):
        if eq == "thd,nd->thn":
            seen.append(ops[0].shape[0])
        return real_einsum(eq, *ops)

    monkeypatch.setattr(indexer_mod, "SCORE_ELEMENTS", 2 * 11 * 5)     # 5 query rows a chunk
    monkeypatch.setattr(indexer_mod.torch, "einsum", spy)
    chunked = ix.scores(q, keys, w)
    assert seen == [5] * 7 + [2]
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-5)     # a chunk's GEMM may block rows anew
    monkeypatch.setattr(indexer_mod, "SCORE_ELEMENTS", 1 << 28)
    seen.clear()
    assert torch.equal(ix.scores(q, keys, w), whole) and seen == [37]      # fits: one chunk, the whole's bits
    assert indexer_mod.query_rows(32768, 64 * 8192) * 64 * 8192 <= 1 << 28
    assert indexer_mod.query_rows(1, 10 ** 12) == 1
