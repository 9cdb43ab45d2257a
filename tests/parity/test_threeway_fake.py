"""The three columns with fake models: which models are built, anchors, absent bug budget, cache."""
from __future__ import annotations

from pathlib import Path

import pytest

from dsv4.plan import PrecisionPlan
from parity.errors import ParityInputError
from parity.records import to_frame
from parity.threeway import RunSpec, resolve_kernel_backend, run_threeway

from .fakes import FakeLoaders


def test_columns_build_one_model_at_a_time_and_record_each_pair(tiny, chat_prompts, fake_loaders) -> None:
    spec = RunSpec(source=tiny, prompts=chat_prompts, plan=PrecisionPlan.preset("default"), profile="official")
    res = run_threeway(spec, fake_loaders)
    # logic is anchored by bf16 whatever --profile says; floor by the requested profile
    assert fake_loaders.built == ["reference:bf16", "native:all-fp32/emulated", "reference:official",
                                  "native:default/emulated"]
    df = to_frame(res.records)
    assert set(df["pair"]) == {"logic", "floor"}
    logic, floor = df[df["pair"] == "logic"], df[df["pair"] == "floor"]
    assert set(logic["profile"]) == {"bf16"} and set(floor["profile"]) == {"official"}
    assert set(logic["plan"]) == {"all-fp32"} and set(floor["plan"]) == {"default"}
    assert set(df["compare_mode"]) == {"propagated", "isolated"}
    assert {"*"} < set(df["prompt_id"])   # run-level aggregates beside the per-prompt rows
    assert not res.columns["bug_budget"].ran
    assert res.columns["bug_budget"].reason.startswith("no kernel backend executes on cpu")
    # logic column: all-fp32 fakes have no noise, so the logits agree exactly
    kl = logic[(logic["metric"] == "kl_mean") & (logic["prompt_id"] == "*")]["value"]
    assert (kl == 0).all()


def test_emulated_backend_request_explains_the_absent_column() -> None:
    name, reason = resolve_kernel_backend("emulated", "cpu")
    assert name is None and "emulated" in reason


@pytest.mark.parametrize("backend, message", [("nope", "expected one of"), ("cutedsl_sm90", "cannot execute")])
def test_bad_backend_is_bad_input(backend: str, message: str) -> None:
    with pytest.raises(ParityInputError, match=message):
        resolve_kernel_backend(backend, "cpu")


def test_reference_cache_runs_the_reference_once(tiny, chat_prompts, tmp_path: Path) -> None:
    spec = RunSpec(source=tiny, prompts=chat_prompts, plan=PrecisionPlan.preset("default"),
                   reference_cache=tmp_path, columns=("floor",))
    first = FakeLoaders(tiny.fingerprint)
    a = run_threeway(spec, first)
    second = FakeLoaders(tiny.fingerprint)
    b = run_threeway(spec, second)
    assert "reference:bf16" in first.built and "reference:bf16" not in second.built
    assert b.cache_hits == len(chat_prompts)
    va = to_frame(a.records).set_index(["prompt_id", "compare_mode", "probe", "metric", "position"])["value"]
    vb = to_frame(b.records).set_index(["prompt_id", "compare_mode", "probe", "metric", "position"])["value"]
    assert va.equals(vb)   # cached anchors give identical measurements


def test_a_model_of_another_checkpoint_is_rejected(tiny, chat_prompts) -> None:
    spec = RunSpec(source=tiny, prompts=chat_prompts, plan=PrecisionPlan.preset("default"), columns=("floor",))
    with pytest.raises(ParityInputError, match="fingerprint"):
        run_threeway(spec, FakeLoaders("0" * 64))


@pytest.mark.parametrize("damage", ["manifest", "tensors", "wrong-key"])
def test_a_corrupt_reference_cache_entry_is_recomputed(tiny, chat_prompts, tmp_path: Path, damage, capsys) -> None:
    import json

    spec = RunSpec(source=tiny, prompts=chat_prompts[:1], plan=PrecisionPlan.preset("default"),
                   reference_cache=tmp_path, columns=("floor",))
    run_threeway(spec, FakeLoaders(tiny.fingerprint))
    (entry,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    if damage == "manifest":
        (entry / "manifest.json").write_text("{half")
    elif damage == "tensors":
        (entry / "probes.safetensors").write_bytes(b"\x00" * 16)
    else:
        m = json.loads((entry / "manifest.json").read_text())
        (entry / "manifest.json").write_text(json.dumps(dict(m, key="0" * 32)))
    again = FakeLoaders(tiny.fingerprint)
    b = run_threeway(spec, again)
    assert "reference:bf16" in again.built and b.cache_hits == 0          # recomputed, not a traceback
    assert "is corrupt" in capsys.readouterr().err
    third = FakeLoaders(tiny.fingerprint)
    assert run_threeway(spec, third).cache_hits == 1                       # and stored again, whole
