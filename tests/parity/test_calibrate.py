"""The calibration method: thresholds from worst clean values, margins, noise floors, exact rules."""
from __future__ import annotations

import pytest

from parity.calibrate import (LOGIC_FLIP_FACTOR, POLICIES, TAIL_FACTOR, calibrated_rules, derive_rules,
                              leave_one_out, margin_for, probe_group, render_toml, threshold)
from parity.records import to_frame
from parity.rules import DEFAULT_SETTINGS, judge, parse_rules

from .records_util import rec


def test_probe_groups_generalize_over_layers() -> None:
    assert probe_group("layers.12.attn.q") == r"^layers\.\d+\.attn\.q$"
    assert probe_group("logits") == "^logits$"


def test_threshold_formula_and_noise_floor() -> None:
    cos, rd = POLICIES["cosine"], POLICIES["rel_diff"]
    assert threshold(cos, 0.99, 2.0) == pytest.approx(0.98)
    assert threshold(rd, 0.01, 2.0) == pytest.approx(0.02)
    assert threshold(cos, 1.0, 2.0) == pytest.approx(1 - cos.noise_floor)   # bit-exact in calibration
    assert threshold(rd, 0.0, 2.0) == rd.noise_floor


def test_margins() -> None:
    assert margin_for(POLICIES["rel_diff"], "floor", "isolated", 2.0) == 2.0
    assert margin_for(POLICIES["rel_diff_tok_max"], "floor", "isolated", 2.0) == 2.0 * TAIL_FACTOR
    assert margin_for(POLICIES["rel_diff"], "logic", "isolated", 2.0) == 2.0 * LOGIC_FLIP_FACTOR
    assert margin_for(POLICIES["rel_diff_tok_p50"], "logic", "isolated", 2.0) == 2.0
    assert margin_for(POLICIES["kl_p50"], "logic", "propagated", 2.0) == 2.0 * LOGIC_FLIP_FACTOR


def _clean_records() -> list[dict]:
    rows = []
    for seed, (q_cos, kl) in {1: (0.97, 0.3), 2: (0.95, 0.5), 3: (0.96, 0.4)}.items():
        for layer in (0, 1):
            rows.append(rec(f"layers.{layer}.attn.q", "cosine", q_cos - 0.01 * layer, seed=seed))
            rows.append(rec(f"layers.{layer}.attn.q", "cosine", 0.9, seed=seed, pair="logic", mode="propagated"))
        rows.append(rec("logits", "kl_mean", kl, prompt="*", mode="propagated", seed=seed))
    return rows


def test_derive_rules_takes_the_worst_over_seeds_and_layers() -> None:
    rules = derive_rules(to_frame(_clean_records()), 2.0)
    q = [r for r in rules if r["metric"] == "cosine"]
    assert len(q) == 1   # the logic/propagated per-probe rows are not judged
    assert q[0]["probe"] == r"^layers\.\d+\.attn\.q$" and q[0]["op"] == ">="
    assert q[0]["value"] == pytest.approx(1 - 2 * (1 - 0.94))
    assert "seed 2" in q[0]["note"]
    kl = [r for r in rules if r["metric"] == "kl_mean"]
    assert kl[0]["value"] == pytest.approx(1.0) and kl[0]["profile"] == "bf16"
    assert {r["metric"] for r in rules if r["op"] == "=="} == {"hash_route_exact", "entry_count_match",
                                                                "nonfinite_mismatch", "shape_mismatch"}


def test_generated_file_parses_and_judges_its_own_calibration_data() -> None:
    df = to_frame(_clean_records())
    rules = calibrated_rules(df, 2.0)
    header = {k: "x" for k in ("source", "profiles", "plan", "margin", "tail", "flip", "bug_budget")}
    rs = parse_rules(render_toml(rules, dict(DEFAULT_SETTINGS), {"header": header, "seeds": [1, 2, 3]}))
    assert rs.calibration["seeds"] == [1, 2, 3]
    assert judge(df, rs)["passed"].all()   # the clean data passes the rules made from it
    assert any(r.pair == "bug_budget" for r in rs.rules)


def test_leave_one_seed_out_reports_held_out_failures() -> None:
    rows = _clean_records()
    rows.append(rec("layers.0.attn.q", "cosine", 0.5, seed=3))   # seed 3 far outside seeds 1-2
    failed, total, what = leave_one_out(to_frame(rows), 2.0)
    assert total > 0 and failed >= 1
    assert any("seed 3" in w and "attn.q" in w for w in what)


def test_rules_nothing_could_fail_are_not_written() -> None:
    rows = [rec("layers.0.attn.out", "rel_diff_tok_max", 1.5, seed=s) for s in (1, 2, 3)]   # x4 margin > 2
    rows += [rec("layers.0.attn.out", "rel_diff", 0.01, seed=s) for s in (1, 2, 3)]
    metrics = {r["metric"] for r in derive_rules(to_frame(rows), 2.0)}
    assert "rel_diff" in metrics and "rel_diff_tok_max" not in metrics


def test_leave_one_prompt_out_skips_run_level_aggregates() -> None:
    rows = [rec(f"layers.{layer}.attn.q", "cosine", 0.97 - 0.01 * layer, seed=1, prompt=p)
            for p in ("p1", "p2", "p3") for layer in (0, 1)]
    rows.append(rec("layers.0.attn.q", "cosine", 0.5, seed=1, prompt="p3"))   # p3 far outside p1-p2
    rows.append(rec("logits", "kl_mean", 0.01, seed=1, prompt="*"))
    failed, total, what = leave_one_out(to_frame(rows), 2.0, "prompt_id")
    assert failed >= 1 and any(w.startswith("prompt_id p3:") and "attn.q" in w for w in what)
    assert not any(w.startswith("prompt_id *") for w in what)


def test_envelope_keeps_the_looser_rule_of_each_side_and_says_so() -> None:
    from parity.calibrate import _HEADER_BLANK, envelope

    previous = parse_rules(r"""
[[rule]]
probe = '^logits$'
metric = 'kl_mean'
op = '<='
value = 2e-3
pair = 'logic'
note = 'worst 1e-3 | envelope: an older note'

[[rule]]
probe = '^embed$'
metric = 'cosine'
op = '>='
value = 0.99
pair = 'floor'

[[rule]]
probe = '^layers\.0\.attn\.q$'
metric = 'rel_diff'
op = '<='
value = 0.5
""")
    fresh = [{"probe": "^logits$", "metric": "kl_mean", "op": "<=", "value": 1e-3, "pair": "logic", "note": "fresh"},
             {"probe": "^embed$", "metric": "cosine", "op": ">=", "value": 0.98, "pair": "floor", "note": "fresh"},
             {"probe": "^final_norm$", "metric": "rel_diff", "op": "<=", "value": 0.1, "note": "fresh"}]
    out = {r["probe"]: r for r in envelope(fresh, previous, "this run")}
    assert out["^logits$"]["value"] == 2e-3   # previous looser for an error metric
    assert out["^logits$"]["note"] == "worst 1e-3 | envelope: this run needs only 0.001"   # notes never pile up
    assert out["^embed$"]["value"] == 0.98 and "previous file had 0.99" in out["^embed$"]["note"]
    assert out[r"^layers\.0\.attn\.q$"]["value"] == 0.5 and out["^final_norm$"]["value"] == 0.1   # one side only: kept
    parse_rules(render_toml(list(out.values()), dict(DEFAULT_SETTINGS), {"header": _HEADER_BLANK}))
