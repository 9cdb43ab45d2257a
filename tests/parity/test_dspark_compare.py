"""parity.dspark.compare on hand-made captures: the floor's tie rules forgive what they should and
nothing else (a clear flip still counts; logic forgives nothing)."""
from __future__ import annotations

import torch

from parity.dspark.compare import DraftCapture, compare_captures
from parity.dspark.judge import rate_bound

L, E = 4, 8   # a stage layer index (one trunk of 4 layers, stage 0) and the expert count


def _cap(ids, weights, logits, routed):
    p = "layers.4.ffn."
    return DraftCapture(0, [], torch.zeros(1), {p + "router.logits": logits, p + "router.topk_ids": torch.tensor(ids),
                                                 p + "router.weights": torch.tensor(weights),
                                                 p + "routed.out": routed})


def _rows(a, b, tie, common=False):
    return {(r["probe"].split("ffn.")[-1], r["metric"]): r["value"]
            for r in compare_captures(a, b, n_layers=L, stages=1, near_tie=1e-3, router_tie=tie,
                                      common_experts=common)}


def _logits(gap: float) -> torch.Tensor:
    """Two rows; row 1's 2nd and 3rd expert scores are ``gap`` apart (relative ~gap/score)."""
    x = torch.full((2, E), -4.0)
    x[:, 0], x[:, 1], x[:, 2] = 4.0, 2.0, 2.0 - gap
    return x


def test_a_near_tie_flip_is_forgiven_on_the_floor_and_left_out_downstream() -> None:
    routed = torch.randn(2, 16)
    a = _cap([[0, 1], [0, 1]], [[0.7, 0.3], [0.7, 0.3]], _logits(1e-4), routed)
    b = _cap([[0, 1], [0, 2]], [[0.7, 0.3], [0.7, 0.3]], _logits(1e-4), routed.clone().index_fill_(0, torch.tensor([1]), 9.0))
    floor, logic = _rows(a, b, 1e-2), _rows(a, b, 0.0)
    assert floor["router.topk_ids", "selection_agree"] == 1.0
    assert floor["routed.out", "rel_diff"] == 0.0            # the flipped row is left out
    assert logic["router.topk_ids", "selection_agree"] == 0.5
    assert logic["routed.out", "rel_diff"] > 0.1


def test_a_clear_flip_counts_on_the_floor() -> None:
    routed = torch.randn(2, 16)
    a = _cap([[0, 1], [0, 1]], [[0.7, 0.3], [0.7, 0.3]], _logits(1.0), routed)
    b = _cap([[0, 1], [0, 2]], [[0.7, 0.3], [0.7, 0.3]], _logits(1.0), routed)
    assert _rows(a, b, 1e-2)["router.topk_ids", "selection_agree"] == 0.5


def test_the_floor_compares_router_weights_on_the_common_experts() -> None:
    """parity-methods §6: on the floor a clear flip is judged by the selection rate alone; the weights
    of the experts both sides chose still count (a wrong weight there fails), the flipped ones do not."""
    routed = torch.randn(2, 16)
    a = _cap([[0, 1], [0, 1]], [[0.7, 0.3], [0.7, 0.3]], _logits(1.0), routed)
    b = _cap([[0, 1], [0, 2]], [[0.7, 0.3], [0.7, 0.3]], _logits(1.0), routed)   # row 1: expert 1 -> 2
    union, common = _rows(a, b, 1e-2), _rows(a, b, 1e-2, common=True)
    assert union["router.topk_ids", "selection_agree"] == common["router.topk_ids", "selection_agree"] == 0.5
    assert union["router.weights", "rel_diff"] > 0.05
    assert common["router.weights", "rel_diff"] == 0.0
    c = _cap([[0, 1], [0, 2]], [[0.7, 0.3], [0.5, 0.3]], _logits(1.0), routed)   # and expert 0's weight off
    assert _rows(a, c, 1e-2, common=True)["router.weights", "rel_diff"] > 0.01


def test_router_weights_are_compared_per_expert_not_per_top_k_slot() -> None:
    routed = torch.randn(2, 16)
    a = _cap([[0, 1], [0, 1]], [[0.7, 0.3], [0.6, 0.4]], _logits(1.0), routed)
    b = _cap([[0, 1], [1, 0]], [[0.7, 0.3], [0.4, 0.6]], _logits(1.0), routed)   # same sets, another order
    r = _rows(a, b, 1e-2)
    assert r["router.topk_ids", "selection_agree"] == 1.0
    assert r["router.weights", "rel_diff"] == 0.0 and r["router.weights", "cosine"] > 1 - 1e-12
    c = _cap([[0, 1], [1, 0]], [[0.7, 0.3], [0.6, 0.4]], _logits(1.0), routed)  # weights swapped between experts
    assert _rows(a, c, 1e-2)["router.weights", "rel_diff"] > 0.01


def test_rate_bounds_widen_for_a_small_judged_sample_and_never_vanish() -> None:
    assert rate_bound(0.98, 120, 5) < rate_bound(0.98, 120, 120) < 0.98 - 0.02
    assert 0 < rate_bound(1.0, 24, 4) < rate_bound(1.0, 24, 24) < 1.0 - 0.02   # N rows without a miss
    assert rate_bound(0.1, 10, 1) == 0.0
