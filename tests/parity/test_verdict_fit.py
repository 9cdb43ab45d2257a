"""Whether a time-to-verdict estimate's resident models fit the cards it names, and the streamed
reference's reads from storage (parity.verdict_fit): a row that cannot run as estimated says so."""
from __future__ import annotations

import math

import pytest

from dsv4.config import preset
from parity.verdict_fit import (USABLE, Need, cards_needed, fit_note, model_needs, reference_read_seconds,
                                streamed_models)
from parity.verdict_time import layer_params

H100, B200 = "NVIDIA H100 80GB HBM3", "NVIDIA B200"


def test_the_native_models_of_a_run_and_the_cards_they_need() -> None:
    pro = preset("pro")
    logic, default = model_needs(pro, H100)
    assert logic.model.startswith("native all-fp32") and default.model.startswith("native default")
    assert default.cards == math.ceil(default.weight_bytes / (USABLE * 80e9)) == 13     # 828 GiB of NVFP4
    assert logic.weight_bytes > 7 * default.weight_bytes                                 # FP32 against 4-bit
    assert [n.model for n in model_needs(pro, H100, ("floor", "bug_budget"))] == [default.model]
    tiny = preset("tiny")
    assert all(n.cards == 1 for n in model_needs(tiny, H100))
    assert model_needs(tiny, "cpu (2 cores)")[0].cards is None


def test_fit_notes_per_card_count_and_per_rank() -> None:
    needs = [Need("native default", 900 * 2**30, 6)]
    ok, note = fit_note(needs, B200, 8)
    assert ok and note.startswith("fits:") and "6 x B200" in note
    ok, note = fit_note(needs, B200, 8, per_rank=True)       # every rank holds its own copy
    assert not ok and note.startswith("does not fit one card a rank")
    ok, note = fit_note(needs, B200, 4)
    assert not ok and note.startswith("does not fit 4 cards")
    assert fit_note([Need("m", 1, None)], "cpu", 1)[1].startswith("fit unknown")
    assert cards_needed([Need("a", 1, 3), Need("b", 1, 13)]) == 13 and cards_needed([Need("a", 1, None)]) is None


def table(per_layer: float = 14e9, host: float = 135e9) -> dict:
    c = preset("pro")
    summary = {k: getattr(c, k) for k in ("hidden_size", "moe_intermediate_size", "n_routed_experts",
                                          "num_attention_heads", "head_dim", "q_lora_rank", "o_lora_rank")}
    return {"config": {**summary, "num_hidden_layers": 2}, "machine": {"card": H100, "host_memory_bytes": host},
            "build": {"official": {"per_layer_bytes": {"0": per_layer, "1": per_layer}}},
            "runs": [{"phase": "load", "seconds": 50.0, "disk_read_bytes": 30e9}]}   # 0.6 GB/s


def test_the_streamed_reference_rereads_a_checkpoint_larger_than_the_host() -> None:
    pro = preset("pro")
    notes: list[str] = []
    got = reference_read_seconds(table(), pro, 5, notes)
    assert got == pytest.approx(5 * 14e9 * pro.num_hidden_layers / 0.6e9)
    assert "exceeds the host's 135 GB" in notes[0] and "0.60 GB/s" in notes[0]
    notes.clear()
    assert reference_read_seconds(table(per_layer=1e9), pro, 5, notes) == 0.0          # 61 GB: page cache
    assert "fits the host" in notes[0]
    tiny = preset("tiny")
    small = reference_read_seconds(table(), tiny, 5, [])
    assert small == 0.0 and layer_params(tiny) < layer_params(pro)
    no_build = table()
    del no_build["build"]
    assert reference_read_seconds(no_build, pro, 5, []) is None


def test_an_estimate_for_one_h100_at_pro_size_streams_and_counts_its_rereads() -> None:
    from parity.verdict_time import estimate, load_seconds, load_tables

    tables = load_tables()
    pro = preset("pro")
    e = estimate(pro, [1024] * 5, ["floor", "bug_budget"], card=H100, tables=tables)
    assert e is not None and e.fits and e.cards_needed == 13       # a device map would need 13
    assert "streamed" in e.fit and any(line.startswith("  memory: streamed") for line in e.lines())
    assert e.breakdown.get("reference_reads", 0) > 0
    one = load_seconds(next(t for t in tables if t["_file"].endswith(e.table)), pro, 1, [])
    share = streamed_models(pro, H100, ["floor"])[0].reread_share
    assert 0.9 < share < 1                                          # 828 GiB against 72 GB usable
    # passes over the plan's model: the floor column's, the audit's walk, the bug budget's (layer by layer)
    assert e.breakdown["native_rereads"] == pytest.approx(2 * share * one)
    b = estimate(pro, [1024] * 5, ["floor", "bug_budget"], card=B200, tables=tables, cards=8)
    assert b.fits and b.cards_needed == 6 and "native_rereads" not in b.breakdown   # resident over 6 of 8


def test_the_logic_columns_fp32_pro_model_cannot_stream_on_one_h100() -> None:
    from parity.verdict_time import estimate, load_tables

    e = estimate(preset("pro"), [1024] * 5, ["logic", "floor", "bug_budget"], card=H100, tables=load_tables())
    assert e is not None and not e.fits
    assert "cannot stream: native all-fp32 (logic): its embedding, head and largest layer" in e.fit
    st = {m.model: m for m in streamed_models(preset("pro"), H100, ["logic", "floor"])}
    assert not st["native all-fp32 (logic)"].feasible and st["native default (floor / bug budget)"].feasible
    assert streamed_models(preset("pro"), "some card", ["floor"]) is None    # memory unknown


def test_with_a_device_map_the_estimate_does_not_stream() -> None:
    """A device map builds the native model whole (fit_check.streams_native), so the estimate says the
    cards it needs instead of streaming on the one named."""
    from parity.verdict_time import estimate, load_tables

    e = estimate(preset("pro"), [1024] * 5, ["floor", "bug_budget"], card=H100, tables=load_tables(), may_stream=False)
    assert e is not None and not e.fits and "native_rereads" not in e.breakdown
    assert e.fit.startswith("does not fit 1 card") and e.cards_needed == 13


def test_each_rank_streams_on_its_own_card_when_prompts_go_over_ranks() -> None:
    from parity.verdict_time import estimate, load_tables

    e = estimate(preset("pro"), [1024] * 5, ["floor", "bug_budget"], card=B200, tables=load_tables(), cards=8,
                 per_rank=True, readers=8)
    assert e is not None and e.fits and e.fit.startswith("streamed: native default (floor / bug budget) streamed")
    assert e.breakdown["native_rereads"] > 0
    flash = estimate(preset("flash"), [1024] * 5, ["floor", "bug_budget"], card=B200, tables=load_tables(), cards=8,
                     per_rank=True, readers=8)
    assert flash.fits and flash.fit.startswith("fits:") and "native_rereads" not in flash.breakdown   # 151 GiB fits
