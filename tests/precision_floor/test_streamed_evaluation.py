"""A floor-search evaluation on a model larger than its one device streams it and runs its column layer
by layer (it goes through run_threeway): each layer built once a configuration, the same scored
records as the model built whole."""
from __future__ import annotations

import dsv4.streamed as streamed
from dsv4.plan import PrecisionPlan
from parity import fit_check
from precision_floor.cache import EvalStore
from precision_floor.evaluate import Evaluator


def _scored(ev) -> list[tuple]:
    d = ev.records
    return sorted(map(tuple, d[["prompt_id", "probe", "metric", "value"]].astype(str).values.tolist()))


def test_a_streamed_configuration_builds_each_layer_once(tiny, prompts, tmp_path, monkeypatch) -> None:
    plan = PrecisionPlan.preset("all-fp4")
    whole = Evaluator(tiny, prompts, EvalStore(tmp_path / "whole")).evaluate(plan)
    monkeypatch.setattr(streamed, "default_resident_bytes", lambda d: 0)
    need, _, _ = fit_check.streamed_floor(tiny.config, plan)
    monkeypatch.setattr(fit_check, "device_memory", lambda d: need)
    got = Evaluator(tiny, prompts, EvalStore(tmp_path / "streamed")).evaluate(plan)
    (col,) = got.manifest["columns"].values()
    assert "streamed" not in next(iter(whole.manifest["columns"].values()))["describe"]
    assert col["describe"]["streamed"]["builds"] == tiny.config.num_hidden_layers and len(prompts) > 1
    assert len(_scored(whole)) > 20 and _scored(got) == _scored(whole)
