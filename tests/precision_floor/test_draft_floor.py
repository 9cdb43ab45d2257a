"""The draft floor search (precision_floor.draft_floor): the greedy promotion and the revert on a
scorer with known answers, one real score through draft parity, and the CLI's bad input."""
from __future__ import annotations

import pytest

from precision_floor import draft_floor as df
from precision_floor.draft_floor import DRAFT_FLIP_CLASSES, DraftScore, search


def _fake(costs: dict[str, float], tau_cost: dict[str, float]):
    """KL = sum of the FP4 classes' costs; τ = 2 - their τ costs (reference 2)."""
    calls = []

    def score(bf16):
        calls.append(tuple(bf16))
        fp4 = [c for c in DRAFT_FLIP_CLASSES if c not in bf16]
        return DraftScore(tuple(bf16), sum(costs.get(c, 0.0) for c in fp4), 1.0,
                          2.0 - sum(tau_cost.get(c, 0.0) for c in fp4), 2.0, True, 0.0)
    return score, calls


def test_search_promotes_what_the_budget_needs_and_reverts_the_rest() -> None:
    a, b, c = DRAFT_FLIP_CLASSES[:3]
    # a costs most KL, b a little, c only τ: the budget needs a and c in BF16, not b
    score, calls = _fake({a: 0.5, b: 0.01, c: 0.02}, {c: 0.3})
    floor, visited = search(score, kl=0.04, tau_drop=0.1, weight_bytes=lambda x: 1)
    assert floor is not None and set(floor.bf16) == {a, c}
    assert floor.meets(0.04, 0.1) and calls[0] == ()
    assert len(set(calls)) == len(calls)          # each plan scored once


def test_search_reverts_an_early_promotion_that_later_ones_make_redundant() -> None:
    a, b = DRAFT_FLIP_CLASSES[:2]
    # promoting a lowers KL most, but the budget only fails on τ, which b alone fixes
    score, _ = _fake({a: 0.03, b: 0.001}, {b: 0.5})
    floor, _ = search(score, kl=0.05, tau_drop=0.1, weight_bytes=lambda x: 1)
    assert floor.bf16 == (b,)


def test_search_without_a_floor_says_so() -> None:
    score, _ = _fake({c: 1.0 for c in DRAFT_FLIP_CLASSES}, {})
    floor, visited = search(lambda bf16: DraftScore(tuple(bf16), 1.0, 0.0, 1.0, 2.0, True, 0.0),
                            kl=0.1, tau_drop=0.1, weight_bytes=lambda x: 1)
    assert floor is None and any(len(s.bf16) == len(DRAFT_FLIP_CLASSES) for s in visited)


def test_class_bytes_cover_every_flippable_draft_class() -> None:
    from dsv4.config import preset

    b = df.draft_class_bytes(preset("tiny-dspark"))
    assert set(b) == set(DRAFT_FLIP_CLASSES) and all(v > 0 for v in b.values())
    assert max(b, key=b.get) == "draft_routed_experts"


@pytest.mark.slow
def test_one_real_score_is_a_draft_parity_floor_run() -> None:
    from dsv4.plan import PrecisionPlan
    from parity.inputs import encode_prompts, select_prompts
    from parity.source import resolve_checkpoint

    src = resolve_checkpoint("tiny-dspark")
    prompts = encode_prompts(select_prompts("chat")[:1], src.tokenizer, src.config.vocab_size)
    base = PrecisionPlan.preset("default")
    fp4 = df.score_plan(src, prompts, base, (), n_tokens=4)
    bf16 = df.score_plan(src, prompts, base, DRAFT_FLIP_CLASSES, n_tokens=4)
    assert fp4.kl > 0 and bf16.kl >= 0 and fp4.lossless and bf16.lossless
    assert bf16.kl < fp4.kl                        # keeping the draft in BF16 brings it closer to the reference
    assert 1.0 <= fp4.tau <= src.config.dspark_block_size + 1 and fp4.tau_reference == bf16.tau_reference


@pytest.mark.parametrize("argv, msg", [(["--budget-kl", "-1"], "budget"),
                                       (["--checkpoint", "tiny"], "expected a DSpark")])
def test_cli_bad_input_is_one_error(argv, msg, capsys) -> None:
    assert df.main(argv) == 2
    assert msg in capsys.readouterr().err
