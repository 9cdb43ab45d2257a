"""Per-probe comparison and first-divergence localization on a fake model with an injected fault."""
from __future__ import annotations

import pytest
import torch

from parity.compare import ProbeMismatchError, Where, compare_probes
from parity.records import to_frame
from parity.rules import load_rules, parse_rules
from parity.runner import run_isolated, run_propagated
from parity.verdict import evaluate, probe_order_key

from .fakes import FakeModel
from .records_util import ctx

# A loose cosine rule on every float probe: passes the clean noisy model, fails a real fault.
RULES = parse_rules("""
[[rule]]
probe = '.*'
metric = "rel_diff"
op = "<="
value = 5e-3
pair = "floor"
""")


def _records(tiny, test_model, ids):
    c = tiny.config
    anchor = run_propagated(FakeModel(c, tiny.fingerprint), ids)
    prop = run_propagated(test_model, ids)
    iso, _ = run_isolated(test_model, ids, anchor, c.num_hidden_layers)
    rows = []
    for mode, probes in (("propagated", prop.probes), ("isolated", iso)):
        r, _ = compare_probes(anchor.probes, probes, where=Where(ctx(), "floor", mode, "p1", "chat"), config=c,
                              ids=ids, router_bias=tiny.router_bias)
        rows += r
    return to_frame(rows)


def test_clean_noise_passes_and_a_fault_is_localized_to_its_layer_and_component(tiny) -> None:
    ids = torch.arange(64) % tiny.config.vocab_size
    clean = _records(tiny, FakeModel(tiny.config, tiny.fingerprint, noise=0.01), ids)
    assert evaluate(clean, RULES).passed
    faulty = _records(tiny, FakeModel(tiny.config, tiny.fingerprint, noise=0.01, fault=(2, "attn.out", 4.0)), ids)
    v = evaluate(faulty, RULES)
    assert not v.passed
    d = v.first_divergence["floor"]
    assert (d.probe, d.layer, d.component) == ("layers.2.attn.out", 2, "attn_o")
    # propagated: the fault's effects reach layer 3; isolated: layer 3 is clean (it got the anchor's input)
    j = v.judged
    bad = j[~j["passed"]]
    assert (bad[bad["compare_mode"] == "propagated"]["layer"] == 3).any()
    assert not (bad[bad["compare_mode"] == "isolated"]["layer"] == 3).any()


def test_selection_and_entry_records_are_written(tiny) -> None:
    ids = torch.arange(64) % tiny.config.vocab_size
    df = _records(tiny, FakeModel(tiny.config, tiny.fingerprint, noise=0.01), ids)
    metrics = set(df["metric"])
    assert {"hash_route_exact", "router_jaccard_mean", "router_clear_flip_rate", "indexer_topk_overlap_mean",
            "entry_count_match", "kl", "top1_agree_tieaware"} <= metrics
    hash_rows = df[df["metric"] == "hash_route_exact"]
    assert set(hash_rows["layer"]) == {0, 1} and (hash_rows["value"] == 1.0).all()
    # no cosine on integer selections
    assert df[(df["metric"] == "cosine") & df["probe"].str.endswith("topk_ids")].empty


def test_missing_probe_is_an_error_and_a_reshaped_one_a_failed_judgement(tiny) -> None:
    ids = torch.arange(30) % tiny.config.vocab_size
    a = run_propagated(FakeModel(tiny.config, tiny.fingerprint), ids).probes
    w = Where(ctx(), "floor", "propagated", "p1", "chat")
    missing = {k: v for k, v in a.items() if k != "layers.2.attn.q"}
    with pytest.raises(ProbeMismatchError, match="layers.2.attn.q"):
        compare_probes(a, missing, where=w, config=tiny.config, ids=ids)
    reshaped = dict(a, **{"layers.0.attn.kv": a["layers.0.attn.kv"][:, :64],
                          "layers.1.attn.indexer.topk": a["layers.1.attn.indexer.topk"][:, :-1]})
    recs, _ = compare_probes(a, reshaped, where=w, config=tiny.config, ids=ids)
    bad = {(r["probe"], r["value"]) for r in recs if r["metric"] == "shape_mismatch"}
    assert bad == {("layers.0.attn.kv", 1.0), ("layers.1.attn.indexer.topk", 1.0)}
    judged = evaluate(to_frame(recs), load_rules(), divergence_mode="propagated")
    assert not judged.passed and judged.first_divergence["floor"].probe == "layers.0.attn.kv"
    assert any(o.rule.metric == "shape_mismatch" and o.failed == 2 for o in judged.failed_rules)


def test_entry_count_mismatch_is_recorded_not_raised(tiny) -> None:
    ids = torch.arange(30) % tiny.config.vocab_size
    a = run_propagated(FakeModel(tiny.config, tiny.fingerprint), ids).probes
    b = dict(a, **{"layers.1.attn.compressed_kv": a["layers.1.attn.compressed_kv"][:-1]})
    rows, _ = compare_probes(a, b, where=Where(ctx(), "floor", "propagated", "p1", "chat"), config=tiny.config,
                             ids=ids, only=lambda n: n == "layers.1.attn.compressed_kv")
    assert {r["metric"]: r["value"] for r in rows}["entry_count_match"] == 0.0


def test_probe_order_is_execution_order() -> None:
    names = ["logits", "layers.1.attn.q", "embed", "layers.0.out", "layers.1.hc.attn.pre", "hc_head"]
    assert sorted(names, key=probe_order_key) == ["embed", "layers.0.out", "layers.1.hc.attn.pre",
                                                  "layers.1.attn.q", "hc_head", "logits"]


def _one_layer(flip_margin: float) -> tuple[dict, dict]:
    """Layer 2 (score-routed): token 0's top-1 expert flips; its routed output differs a lot."""
    T, E = 6, 8
    logits = torch.zeros(T, E)
    logits[:, 1] = 3.0
    logits[0, 2] = 3.0 - flip_margin       # expert 2 just below expert 1 for token 0
    ids_a = torch.ones(T, 1, dtype=torch.int64)
    ids_b = ids_a.clone()
    ids_b[0, 0] = 2
    out_a = torch.randn(T, 16, generator=torch.Generator().manual_seed(0))
    out_b = out_a.clone()
    out_b[0] = -out_a[0]
    a = {"layers.2.ffn.router.logits": logits, "layers.2.ffn.router.topk_ids": ids_a, "layers.2.ffn.routed.out": out_a}
    b = {"layers.2.ffn.router.logits": logits, "layers.2.ffn.router.topk_ids": ids_b, "layers.2.ffn.routed.out": out_b}
    return a, b


@pytest.mark.parametrize("margin, excluded", [(1e-4, True), (1.0, False)])
def test_untied_metrics_drop_only_near_tie_flips(tiny, margin: float, excluded: bool) -> None:
    a, b = _one_layer(margin)
    rows, _ = compare_probes(a, b, where=Where(ctx(), "logic", "isolated", "p1", "chat"), config=tiny.config,
                             ids=torch.arange(6), router_bias=None)
    got = {(r["probe"], r["metric"]): r["value"] for r in rows}
    raw = got[("layers.2.ffn.routed.out", "rel_diff")]
    untied = got[("layers.2.ffn.routed.out", "rel_diff_untied")]
    assert raw > 0.05
    assert (untied == 0.0) if excluded else (untied == pytest.approx(raw))
    rows, _ = compare_probes(a, b, where=Where(ctx(), "logic", "propagated", "p1", "chat"), config=tiny.config,
                             ids=torch.arange(6), router_bias=None)
    assert not any(r["metric"].endswith("_untied") for r in rows)   # exact only in isolated mode
