"""Lightning indexer (spec §7): scores by hand, causal top-k with −1, ties, and top-k ≥ available
entries being the same as dense attention over every visible compressed entry."""
from __future__ import annotations

import torch

from dsv4 import probes
from reference.attention import Attention
from reference.indexer import index_scores, select_topk, sorted_topk, visible_entries


def test_scores_by_hand() -> None:
    q = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])          # T=1, Hi=2, di=2
    keys = torch.tensor([[2.0, -1.0], [-1.0, 3.0]])
    w = torch.tensor([[0.5, 2.0]])
    # I(0,0) = 0.5·relu(2) + 2·relu(−1) = 1;  I(0,1) = 0.5·relu(−1) + 2·relu(3) = 6
    assert index_scores(q, keys, w).tolist() == [[1.0, 6.0]]


def test_causal_topk_with_invalid_slots() -> None:
    pos = torch.tensor([2, 3, 9])
    vis = visible_entries(pos, 4)                          # 0, 1, 2 entries visible
    assert vis.tolist() == [0, 1, 2]
    scores = torch.tensor([[5.0, 1.0, 2.0], [5.0, 1.0, 2.0], [5.0, 1.0, 2.0]])
    scores = scores.masked_fill(torch.arange(3) >= vis.unsqueeze(1), float("-inf"))
    idx = select_topk(scores, vis, 2)
    assert idx.tolist() == [[-1, -1], [0, -1], [0, 1]]
    assert sorted_topk(torch.tensor([[-1, 3, 1]])).tolist() == [[1, 3, -1]]


def test_ties_go_to_the_lower_entry() -> None:
    """ReLU scores are often exactly 0: the choice must not depend on how many entries exist."""
    s = torch.tensor([[0.0, 3.0, 0.0, 0.0]])
    assert select_topk(s, torch.tensor([4]), 2).tolist() == [[1, 0]]
    assert select_topk(s[:, :3], torch.tensor([3]), 2).tolist() == [[1, 0]]


def test_topk_covering_every_entry_equals_dense_attention(tiny_with, make_ids, monkeypatch) -> None:
    ids = make_ids(48, seed=7)
    big = tiny_with(index_topk=10_000)
    with probes.ProbeRecorder() as rec:
        sparse_logits = big(ids)
    for i in (1, 3):                                        # CSA layers select every visible entry
        topk = rec[f"layers.{i}.attn.indexer.topk"]
        vis = visible_entries(torch.arange(48), 4)
        want = torch.where(torch.arange(12) < vis.unsqueeze(1), torch.arange(12), -1)
        assert topk.shape == (48, 12) and torch.equal(topk, want)

    # The same model with the CSA layers' indexer removed attends densely (the HCA rule j < ⌊(t+1)/m⌋).
    original = Attention.__init__

    def no_indexer(self, *a, **kw):
        kw["indexer"] = None
        original(self, *a, **kw)

    monkeypatch.setattr(Attention, "__init__", no_indexer)
    dense_logits = tiny_with(index_topk=10_000)(ids)
    assert torch.equal(sparse_logits, dense_logits)
    monkeypatch.setattr(Attention, "__init__", original)
    assert not torch.allclose(tiny_with()(ids), dense_logits, atol=1e-3)   # index_topk = 4: selection matters
