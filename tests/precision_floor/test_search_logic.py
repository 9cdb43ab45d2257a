"""The floor-search algorithm on a known score table (no model): greedy order, add-then-revert,
infeasible budgets, the ranked strategy's evaluation count, and the Pareto front."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from dsv4.plan import PrecisionPlan
from precision_floor.errors import FloorInputError
from precision_floor.evaluate import FLIP_CLASSES, PlanScore
from precision_floor.search import Budget, floor_search, pareto_front


class TableScorer:
    """Scores a plan from the set of classes it keeps in BF16: KL = table[frozenset] (or a default),
    bytes = 1000 + 100 per BF16 class. Counts the distinct plans scored."""

    def __init__(self, kl: dict[frozenset, float], default: float = 1.0) -> None:
        self.kl, self.default, self.seen = kl, default, set()

    def score(self, plan: PrecisionPlan) -> PlanScore:
        bf16 = frozenset(c for c in FLIP_CLASSES if plan[c] == "bf16")
        self.seen.add(plan.key())
        return PlanScore(plan=plan, digest=plan.key(), kl=self.kl.get(bf16, self.default), kl_se=0.0, top1=1.0,
                         top1_se=0.0, kl_all=math.nan, kl_all_se=math.nan, worst_cos=1.0, worst_cos_layer=None,
                         router_jaccard=1.0, indexer_overlap=1.0, n_prompts=1, bytes=1000 + 100 * len(bf16))


S = frozenset
ALL = S(FLIP_CLASSES)


def test_greedy_promotes_the_best_class_then_reverts_a_redundant_one() -> None:
    # a alone: 0.5, b alone: 0.6 -> greedy takes a; then {a,b}: 0.3 (fails 0.25), {a,b,c}: 0.2 holds;
    # {b,c} (a reverted) 0.22 still holds and saves a's bytes -> the floor is {b, c}.
    kl = {S(): 1.0, S({"lm_head"}): 0.5, S({"router"}): 0.6, S({"lm_head", "router"}): 0.3,
          S({"lm_head", "router", "attn_kv"}): 0.2, S({"router", "attn_kv"}): 0.22, ALL: 0.0}
    sc = TableScorer(kl, default=0.9)
    r = floor_search(sc, Budget(kl=0.25, top1=0.0))
    assert [s.phase for s in r.steps] == ["start", "ceiling", "promote", "promote", "promote", "revert"]
    assert [s.cls for s in r.steps if s.phase == "promote"] == ["lm_head", "router", "attn_kv"]
    assert r.met and sorted(r.floor_set) == ["attn_kv", "router"]
    assert r.score.kl == pytest.approx(0.22)
    assert r.score.bytes - r.start_bytes == 200


def test_infeasible_budget_promotes_everything_and_says_so() -> None:
    sc = TableScorer({ALL: 0.5}, default=1.0)
    r = floor_search(sc, Budget(kl=0.1, top1=0.0), strategy="ranked")
    assert not r.met
    assert [s.phase for s in r.steps] == ["start", "ceiling"] + ["promote"] * len(FLIP_CLASSES)
    assert sorted(r.floor_set) == sorted(FLIP_CLASSES)


def test_a_subset_can_meet_a_budget_the_ceiling_misses() -> None:
    # KL is not monotone in promotions: {lm_head} meets the budget although every class in BF16 does not.
    sc = TableScorer({S({"lm_head"}): 0.05, ALL: 0.2}, default=1.0)
    r = floor_search(sc, Budget(kl=0.1, top1=0.0))
    assert r.met and r.floor_set == ["lm_head"]


def test_budget_met_by_all_fp4_needs_one_evaluation() -> None:
    sc = TableScorer({}, default=0.01)
    r = floor_search(sc, Budget(kl=0.05, top1=0.0))
    assert r.met and r.floor_set == [] and len(sc.seen) == 1


def test_ranked_strategy_follows_the_rescue_order_with_fewer_evaluations() -> None:
    single = {S({c}): 0.9 - 0.01 * i for i, c in enumerate(FLIP_CLASSES)}   # last class best alone
    kl = {**single, S(): 1.0, ALL: 0.0, S(FLIP_CLASSES[-2:]): 0.1}
    steep, ranked = TableScorer(kl, 0.95), TableScorer(kl, 0.95)
    r1 = floor_search(steep, Budget(kl=0.2, top1=0.0), strategy="steepest")
    r2 = floor_search(ranked, Budget(kl=0.2, top1=0.0), strategy="ranked")
    assert sorted(r1.floor_set) == sorted(r2.floor_set) == sorted(FLIP_CLASSES[-2:])
    assert [s.cls for s in r2.steps if s.phase == "promote"] == [FLIP_CLASSES[-1], FLIP_CLASSES[-2]]
    assert len(ranked.seen) < len(steep.seen)


def test_bad_budget_and_strategy_are_input_errors() -> None:
    with pytest.raises(FloorInputError, match="budget-top1"):
        Budget(kl=0.1, top1=1.5)
    with pytest.raises(FloorInputError, match="budget-kl"):
        Budget(kl=-1.0)
    with pytest.raises(FloorInputError, match="strategy"):
        floor_search(TableScorer({}), Budget(), strategy="random")
    with pytest.raises(FloorInputError, match="classes"):
        floor_search(TableScorer({}), Budget(), classes=["kv_cache"])


def test_pareto_front_keeps_only_undominated_points() -> None:
    df = pd.DataFrame({"bytes": [1, 2, 3, 2, 4], "kl": [0.5, 0.3, 0.3, 0.6, 0.1]})
    assert pareto_front(df) == [True, True, False, False, True]
