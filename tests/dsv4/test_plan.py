"""PrecisionPlan: presets as data, validation with clear errors, TOML/dict round trips, stable names/keys."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dsv4.plan import LEGAL_FORMATS, PRESETS, PlanError, PrecisionPlan, resolve_plan
from dsv4.probes import PLAN_CLASSES


def test_presets_match_the_documented_table():
    d, f4, b16 = (dict(PrecisionPlan.preset(n).components) for n in ("default", "all-fp4", "all-bf16"))
    assert set(d) == set(PLAN_CLASSES)
    assert {c for c, v in d.items() if v == "bf16"} == {"lm_head", "router", "compressor", "indexer_weights",
                                                        "draft_router", "draft_hc_head", "draft_markov_head",
                                                        "draft_confidence_head"}
    assert d["kv_cache"] == "fp8" and f4["kv_cache"] == "fp8" and b16["kv_cache"] == "bf16"
    assert all(v == "fp4" for c, v in f4.items() if c != "kv_cache")
    assert set(b16.values()) == {"bf16"}


def test_unknown_class_format_and_illegal_pair_are_rejected_with_expected_and_found():
    with pytest.raises(PlanError, match=r"unknown component class: expected one of .*found 'lm_haed'"):
        PrecisionPlan.from_dict({"components": {"lm_haed": "fp4"}})
    with pytest.raises(PlanError, match=r"class 'router': unknown format: expected one of \['fp4', 'fp8', "
                                        r"'bf16', 'fp32'\], found 'int8'"):
        PrecisionPlan.from_dict({"components": {"router": "int8"}})
    with pytest.raises(PlanError, match=r"class 'kv_cache': illegal format: expected one of \['fp8', 'bf16', 'fp32'\], "
                                        r"found 'fp4'"):
        PrecisionPlan.from_dict({"base": "all-bf16", "components": {"kv_cache": "fp4"}})
    with pytest.raises(PlanError, match="plan base: expected one of"):
        PrecisionPlan.from_dict({"base": "fast"})
    with pytest.raises(PlanError, match="unknown keys"):
        PrecisionPlan.from_dict({"base": "default", "component": {}})
    with pytest.raises(PlanError, match="illegal format"):
        PrecisionPlan.preset("default").replace(kv_cache="fp4")
    assert LEGAL_FORMATS["kv_cache"] == ("fp8", "bf16", "fp32")
    # fp32 is the whole-model logic mode: never mixed with other formats
    with pytest.raises(PlanError, match=r"fp32 is a whole-model mode .* found only \['router'\]"):
        PrecisionPlan.preset("default").replace(router="fp32")
    assert PrecisionPlan.preset("all-fp32").act_dtype == "fp32" and PrecisionPlan.preset("default").act_dtype == "bf16"


def test_toml_round_trip_and_overrides():
    text = 'base = "default"\n\n[components]\nlm_head = "fp4"\nkv_cache = "bf16"\n'
    plan = PrecisionPlan.from_toml(text)
    assert plan["lm_head"] == "fp4" and plan["kv_cache"] == "bf16" and plan["router"] == "bf16"
    assert plan.overrides() == {"lm_head": "fp4", "kv_cache": "bf16"}
    assert plan.name == "default+kv_cache=bf16,lm_head=fp4"
    assert PrecisionPlan.from_toml(plan.to_toml()) == plan
    assert PrecisionPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(PlanError, match="syntax error"):
        PrecisionPlan.from_toml("base = \n[components")


def test_toml_file_and_resolve(tmp_path):
    p = tmp_path / "flip.toml"
    p.write_text('base = "all-bf16"\n[components]\nrouted_experts = "fp4"\n')
    plan = resolve_plan(str(p))
    assert plan == resolve_plan(p) == PrecisionPlan.preset("all-bf16").replace(routed_experts="fp4")
    assert resolve_plan("all-fp4") == PrecisionPlan.preset("all-fp4")
    assert resolve_plan({"base": "default"}).name == "default"
    with pytest.raises(PlanError, match="expected a preset"):
        resolve_plan("fastest")
    with pytest.raises(PlanError, match="no file"):
        resolve_plan(str(tmp_path / "missing.toml"))


def test_names_and_keys_are_stable_and_distinguish_plans():
    a = PrecisionPlan.preset("default")
    b = PrecisionPlan.from_dict({"base": "all-bf16", "components": dict(PRESETS["default"])})
    assert a == b and a.name == b.name == "default" and a.key() == b.key() and hash(a) == hash(b)
    c = a.replace(lm_head="fp4")
    assert c.key() != a.key() and c.name != a.name
    assert len({PrecisionPlan.preset(n).key() for n in PRESETS}) == len(PRESETS)
    with pytest.raises(PlanError, match="plan name"):
        PrecisionPlan.from_dict({"name": "all-fp4", "base": "default"})


def test_import_dsv4_and_plan_stay_light():
    code = "import sys, dsv4, dsv4.config, dsv4.plan; print('torch' in sys.modules, 'dsv4.model' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
