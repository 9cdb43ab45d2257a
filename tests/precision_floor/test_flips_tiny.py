"""Flip tables and the floor search on the tiny model (3 classes, 3 prompts, propagated mode)."""
from __future__ import annotations

import math

import pytest

from dsv4.plan import PrecisionPlan
from precision_floor.cache import EvalStore
from precision_floor.errors import FloorInputError
from precision_floor.evaluate import Replay, score_records
from precision_floor.flips import DIRECTIONS, flip_plan, per_prompt_kl, run_flips

from .conftest import CLASSES


def test_flip_plans_change_one_class_and_keep_kv_cache() -> None:
    r = flip_plan("rescue", "router")
    assert r.overrides() == {"router": "bf16"} and r["kv_cache"] == "fp8" and r["lm_head"] == "fp4"
    d = flip_plan("damage", "attn_o")
    assert d.overrides() == {"attn_o": "fp4"} and d["kv_cache"] == "bf16"
    with pytest.raises(FloorInputError, match="flip class"):
        flip_plan("rescue", "kv_cache")
    with pytest.raises(FloorInputError, match="direction"):
        flip_plan("sideways", "router")


def test_tables_rank_lm_head_first_both_ways(study_dir) -> None:
    # Replayed from the stored records of the study fixture: no model runs here.
    import json

    ctx = json.loads((study_dir / "flips.json").read_text())["context"]
    from precision_floor.cache import EvalContext

    t = run_flips(Replay(EvalStore(study_dir), EvalContext.from_dict(ctx)), CLASSES)
    for direction in DIRECTIONS:
        df = t.frame(direction)
        assert list(df["class"])[0] == "lm_head", df[["class", "d_kl"]]
        assert sorted(df["class"]) == sorted(CLASSES)
        assert list(df["effect"]) == sorted(df["effect"], reverse=True)
    rescue, damage = t.rescue.set_index("class"), t.damage.set_index("class")
    fp4, bf16 = t.baselines["all-fp4"], t.baselines["all-bf16"]
    # Promoting the head removes most of all-fp4's first-token KL; demoting it adds most of it back.
    assert rescue.loc["lm_head", "kl"] < 0.5 * fp4.kl
    assert rescue.loc["lm_head", "d_kl"] < 0 and rescue.loc["lm_head", "significant"]
    assert damage.loc["lm_head", "kl"] > 10 * bf16.kl
    # Same prompts on both sides: the mean paired difference is the difference of the means.
    for cls, row in rescue.iterrows():
        assert row["d_kl"] == pytest.approx(row["kl"] - fp4.kl, rel=1e-9, abs=1e-12)
    assert (rescue["class_bytes_delta"] > 0).all() and (damage["class_bytes_delta"] < 0).all()


def test_scores_are_functions_of_the_records(study_dir, tiny, prompts) -> None:
    import json

    from precision_floor.cache import EvalContext

    ctx = EvalContext.from_dict(json.loads((study_dir / "flips.json").read_text())["context"])
    rp = Replay(EvalStore(study_dir), ctx)
    plan = PrecisionPlan.preset("all-fp4")
    ev = rp.evaluate(plan)
    s = score_records(ev.records)
    kl = per_prompt_kl(ev.records)
    assert sorted(kl.index) == sorted(p.id for p in prompts)
    assert s["kl"] == pytest.approx(kl.mean())
    assert s["kl_se"] == pytest.approx(kl.std(ddof=1) / math.sqrt(len(kl)))
    assert 0.9 < s["worst_cos"] < 1.0 and s["worst_cos_layer"] in range(tiny.config.num_hidden_layers)
    assert 0.0 < s["router_jaccard"] <= 1.0 and 0.0 < s["indexer_overlap"] <= 1.0
    assert s["n_prompts"] == len(prompts)


def test_search_floor_on_tiny_is_the_head(study_dir) -> None:
    import json

    s = json.loads((study_dir / "search.json").read_text())
    # The budget was set just above rescue-lm_head's KL: promoting the head alone meets it.
    assert s["met"] and s["floor_set"] == ["lm_head"]
    assert s["floor"]["kl"] <= s["budget"]["kl"]
    assert s["extra_bytes"] > 0
    phases = [st["phase"] for st in s["steps"]]
    assert phases[:3] == ["start", "ceiling", "promote"] and "revert" not in phases
    assert any(v["floor"] for v in s["visited"]) and any(v["pareto"] for v in s["visited"])
