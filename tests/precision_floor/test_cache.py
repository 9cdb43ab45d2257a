"""The evaluation store: keys, atomic entries (the manifest commits), orphans, malformed manifests."""
from __future__ import annotations

import dataclasses
import json

import pytest

import precision_floor.cache as cache_mod
from parity.records import RunContext
from precision_floor.cache import EvalContext, EvalKey, EvalStore
from precision_floor.errors import StoreError

CTX = EvalContext("fp" * 32, "promptset", "bf16", "abc123")


def _records(run_id: str, n: int = 3) -> list[dict]:
    ctx = RunContext(run_id, "abc123", "fp" * 32, "tiny", "all-fp4", "bf16", "emulated", "cpu")
    return [ctx.record(prompt_id="p", prompt_mode="chat", pair="floor", compare_mode="propagated", probe="logits",
                       metric="kl", value=0.1 * i) for i in range(n)]


def test_every_key_field_changes_the_digest() -> None:
    k = CTX.key("plan1", ("floor",), "emulated")
    assert k.digest() == CTX.key("plan1", ["floor"], "emulated").digest()
    changed = [dataclasses.replace(k, **{f.name: (("x",) if f.name in ("columns", "modes") else "other")})
               for f in dataclasses.fields(EvalKey)]
    assert len({c.digest() for c in changed} | {k.digest()}) == len(changed) + 1


def test_put_then_load_round_trips(tmp_path) -> None:
    store = EvalStore(tmp_path)
    key = CTX.key("plan1", ("floor",), "emulated")
    assert not store.has(key)
    store.put(key, _records(key.run_id), {"bytes": 7})
    assert store.has(key)
    got = store.load(key)
    assert got.manifest["bytes"] == 7 and got.manifest["n_records"] == 3
    assert list(got.records["value"]) == pytest.approx([0.0, 0.1, 0.2])
    assert set(got.records["run_id"]) == {key.run_id}
    assert EvalContext.from_dict(json.loads(json.dumps(CTX.to_dict()))) == CTX


def test_a_kill_between_records_and_manifest_leaves_no_entry(tmp_path, monkeypatch) -> None:
    store = EvalStore(tmp_path)
    key = CTX.key("plan1", ("floor",), "emulated")

    def killed(path, obj):
        raise KeyboardInterrupt   # the process dies after the records file, before the manifest

    monkeypatch.setattr(cache_mod, "atomic_write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        store.put(key, _records(key.run_id), {"bytes": 7})
    assert (store.evals / f"{key.digest()}.jsonl").exists()
    assert not store.has(key) and store.manifests() == []
    assert not [p for p in store.evals.iterdir() if p.name.startswith(".")]   # no temporary file left


def test_malformed_manifest_is_a_store_error(tmp_path) -> None:
    store = EvalStore(tmp_path)
    key = CTX.key("plan1", ("floor",), "emulated")
    store.put(key, _records(key.run_id), {})
    (store.evals / f"{key.digest()}.json").write_text("{not json")
    with pytest.raises(StoreError, match="invalid JSON"):
        store.load(key)
    with pytest.raises(StoreError, match="context"):
        EvalContext.from_dict({"profile": "bf16"})
