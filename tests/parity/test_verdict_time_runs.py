"""The decode and floor-search time-to-verdict estimates (parity.verdict_time_runs) from a synthetic
measured table: each term is the arithmetic the module documents, and a table without what a run
needs gives no estimate instead of a wrong one."""
from __future__ import annotations

import pytest

from dsv4.config import preset
from parity.verdict_time_runs import at_cache, decode_estimate, floor_search_estimate

CARD = "NVIDIA H100 80GB HBM3"


def flash_table(**extra) -> dict:
    c = preset("flash")
    summary = {k: getattr(c, k) for k in ("hidden_size", "moe_intermediate_size", "n_routed_experts",
                                          "num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank")}
    kinds = ["window/hash", "csa/hash", "hca/score"]

    def prefill(side: str, backend: str, s: float) -> dict:
        return {"side": side, "backend": backend, "phase": "prefill", "tokens": 1024,
                "layers": [{"kind": k, "seconds": s} for k in kinds]}

    def decode(side: str, backend: str, cache: int, s: float) -> dict:
        return {"side": side, "backend": backend, "cache_tokens": cache,
                "layers": [{"kind": k, "seconds_per_step": s} for k in kinds]}

    t = {"bench": "real_width", "model": "flash", "_file": "rw.json", "machine": {"card": CARD},
         "config": {**summary, "name": "flash", "num_hidden_layers": 3},
         "runs": [prefill("reference", "reference(streaming)", 1.0), prefill("native", "emulated", 0.2),
                  prefill("native", "cutedsl_sm90", 0.05), {"side": "native", "backend": "emulated", "phase": "load",
                                                            "seconds": 30.0}],
         "decode": [decode("reference", "reference", 1024, 0.05), decode("reference", "reference", 3072, 0.07),
                    decode("native", "cutedsl_sm90", 1024, 0.01)],
         "harness": [{"overhead_ratio": 2.0, "per_prompt_overhead_ratio": 0.5, "phases": {"weight_audit": 3.0}}]}
    t.update(extra)
    return t


def test_at_cache_is_linear_between_and_flat_beyond() -> None:
    pts = {1024: 1.0, 3072: 2.0}
    assert at_cache(pts, 512) == 1.0 and at_cache(pts, 8192) == 2.0 and at_cache(pts, 2048) == pytest.approx(1.5)
    assert at_cache({4096: 0.3}, 100) == at_cache({4096: 0.3}, 10 ** 6) == 0.3


def test_decode_estimate_terms() -> None:
    c = preset("flash")
    L = c.num_hidden_layers
    e = decode_estimate(c, steps=300, prompt_tokens=1024, card=CARD, tables=[flash_table()])
    assert e is not None and e.table == "rw.json"
    cache = 1024 + 150                                      # the run's mean cache
    ref_step = 0.05 + (0.07 - 0.05) * (cache - 1024) / 2048
    assert e.breakdown["reference_decode"] == pytest.approx(300 * L * ref_step)
    assert e.breakdown["native_decode"] == pytest.approx(300 * L * 0.01 * 1.5)   # x (1 + per-prompt overhead)
    assert e.breakdown["prefills"] == pytest.approx(L * (1.0 + 0.05))
    assert e.breakdown["loads"] == pytest.approx(30.0 / 3 * L)
    assert e.seconds == pytest.approx(sum(e.breakdown.values()))
    assert any("1174-token cache" in a for a in e.assumptions)


def test_floor_search_estimate_terms_and_scaling() -> None:
    c = preset("flash")
    L = c.num_hidden_layers
    e = floor_search_estimate(c, 16, [1024] * 5, card=CARD, tables=[flash_table()])
    assert e is not None
    assert e.breakdown["reference"] == pytest.approx(5 * L * 1.0 * 1.5)
    assert e.breakdown["configurations"] == pytest.approx(16 * 5 * L * 0.2 * 1.5)
    assert e.breakdown["loads"] == pytest.approx(16 * 30.0 / 3 * L)
    b200 = floor_search_estimate(c, 16, [1024] * 5, card="NVIDIA B200", tables=[flash_table()])
    # the forwards scale with memory bandwidth; the loads read the checkpoint, so they do not
    assert b200.breakdown["configurations"] == pytest.approx(e.breakdown["configurations"] * 3.35 / 8.0)
    assert b200.breakdown["loads"] == pytest.approx(e.breakdown["loads"])
    assert any("memory bandwidth" in a for a in b200.assumptions)
    assert any("not scaled by memory bandwidth" in a for a in b200.assumptions)
    # eight ranks loading at once: each at the measured rate, and the aggregate the node must serve is named
    t = flash_table()
    t["runs"][-1]["disk_read_bytes"] = 12e9                  # 0.40 GB/s
    shared = floor_search_estimate(c, 2, [1024] * 5, card="NVIDIA B200", tables=[t], readers=8)
    assert shared.breakdown["loads"] == pytest.approx(2 * 30.0 / 3 * L)
    assert any("8 ranks load at once" in a and "must serve 3.2 GB/s" in a for a in shared.assumptions)
    with pytest.raises(ValueError, match="configurations"):
        floor_search_estimate(c, 0, [1024], card=CARD, tables=[flash_table()])


def test_load_rate_is_named_and_scales_with_parameters_only() -> None:
    from parity.verdict_time import load_seconds

    t = flash_table()
    t["runs"][-1]["disk_read_bytes"] = 12e9                  # 12 GB in the 30 s load: 0.40 GB/s
    notes: list[str] = []
    pro = preset("pro")
    from parity.verdict_time import layer_params

    got = load_seconds(t, pro, 3, notes)
    assert got == pytest.approx(3 * 30.0 / 3 * pro.num_hidden_layers * layer_params(pro) / layer_params(t["config"]))
    assert "0.40 GB/s" in notes[0] and "3 native loads" in notes[0]
    assert load_seconds(flash_table(runs=[]), pro, 1, []) is None


def test_tables_without_what_a_run_needs_give_no_estimate() -> None:
    c = preset("flash")
    assert decode_estimate(c, card=CARD, tables=[flash_table(decode=[])]) is None
    no_emulated = flash_table()
    no_emulated["runs"] = [r for r in no_emulated["runs"] if r["backend"] != "emulated"]
    assert floor_search_estimate(c, 4, [1024], card=CARD, tables=[no_emulated]) is None
    assert decode_estimate(c, card=CARD, tables=[]) is None
