"""Selection agreement: router Jaccard / flips with margins, hash exactness, indexer overlap over
valid entries, entry counts."""
from __future__ import annotations

import math

import pytest
import torch

from parity.selection import cut_margin, entry_agreement, indexer_agreement, router_agreement


def test_router_jaccard_and_flip_rate() -> None:
    a = torch.tensor([[0, 1], [2, 3], [4, 5]])
    b = torch.tensor([[1, 0], [2, 4], [6, 7]])   # same set, one swap, all different
    out = router_agreement(a, b)
    assert out["router_jaccard_mean"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    assert out["router_jaccard_min"] == 0.0
    assert out["router_flip_rate"] == pytest.approx(2 / 3)


def test_clear_flips_are_separated_from_near_ties_by_the_anchor_margin() -> None:
    # softplus is monotone: bigger logit, bigger score. Token 0: experts 1 and 2 nearly tied at the
    # cut (k=1); token 1: a clear winner.
    logits = torch.tensor([[0.0, 5.0, 4.999, -3.0], [0.0, 5.0, 1.0, -3.0]])
    a = torch.tensor([[1], [1]])
    b = torch.tensor([[2], [2]])
    out = router_agreement(a, b, a_logits=logits, tie_margin=1e-2)
    assert out["router_flip_rate"] == 1.0
    assert out["router_clear_flip_rate"] == 0.5
    assert out["router_flip_margin_min"] < 1e-3


def test_hash_layers_require_identical_ids_in_order() -> None:
    a = torch.tensor([[0, 1], [2, 3]])
    ok = router_agreement(a, a.clone(), hash_layer=True)
    assert ok["hash_route_exact"] == 1.0 and ok["hash_mismatch_rate"] == 0.0
    swapped = router_agreement(a, torch.tensor([[1, 0], [2, 3]]), hash_layer=True)
    assert swapped["hash_route_exact"] == 0.0 and swapped["hash_mismatch_rate"] == 0.5


def test_routed_weight_l1_over_the_union() -> None:
    a, b = torch.tensor([[0, 1]]), torch.tensor([[0, 2]])
    wa, wb = torch.tensor([[0.6, 0.4]]), torch.tensor([[0.5, 0.5]])
    out = router_agreement(a, b, a_weights=wa, b_weights=wb)
    assert out["router_weight_l1_mean"] == pytest.approx(0.1 + 0.4 + 0.5)


def test_indexer_overlap_counts_valid_entries_only() -> None:
    a = torch.tensor([[-1, -1], [0, -1], [0, 1], [1, 2]])
    b = torch.tensor([[-1, -1], [0, -1], [0, 2], [1, 2]])
    out = indexer_agreement(a, b)
    # row 0 has no valid anchor entry and is skipped; rows 1, 3 agree; row 2 overlaps 1/2
    assert out["indexer_topk_overlap_mean"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert out["indexer_flip_rate"] == pytest.approx(1 / 3)
    assert out["indexer_valid_count_mismatch"] == 0.0
    more = indexer_agreement(a, torch.tensor([[0, -1], [0, -1], [0, 1], [1, 2]]))
    assert more["indexer_valid_count_mismatch"] == 1.0


def test_exact_score_ties_are_never_clear_flips() -> None:
    scores = torch.tensor([[0.0, 0.0, 0.0, -math.inf]])   # ReLU zeros: an exact three-way tie
    assert cut_margin(scores, 1).tolist() == [0.0]
    out = indexer_agreement(torch.tensor([[0]]), torch.tensor([[1]]), a_scores=scores, tie_margin=1e-2)
    assert out["indexer_flip_rate"] == 1.0 and out["indexer_clear_flip_rate"] == 0.0


def test_no_alternative_candidate_has_infinite_margin() -> None:
    assert math.isinf(cut_margin(torch.tensor([[1.0, -math.inf]]), 1)[0])
    assert math.isinf(cut_margin(torch.tensor([[1.0, 2.0]]), 2)[0])


def test_entry_counts() -> None:
    assert entry_agreement(torch.zeros(5, 3), torch.zeros(5, 3))["entry_count_match"] == 1.0
    out = entry_agreement(torch.zeros(5, 3), torch.zeros(4, 3))
    assert out == {"entry_count_match": 0.0, "entry_count_anchor": 5.0, "entry_count_test": 4.0}
