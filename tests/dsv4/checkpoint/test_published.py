"""Fixtures from published files (tests/dsv4/checkpoint/published/*/PROVENANCE.json says where each
came from): a sparse checkpoint built from a published index and headers (zero data) opens in the
layout it is, every tensor accounted for and validated; the published configs parse to the presets
our layouts are written from; dry-run prints the plan and the memory estimate."""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from dsv4.checkpoint import CheckpointError, open_checkpoint
from dsv4.checkpoint.sparse import expected_tensors, main as sparse_main, read_headers, sparse_checkpoint
from dsv4.config import ALLOW_ENV, ConfigError, DSV4Config, preset
from parity import first_token

HERE = Path(__file__).parent / "published"
REAP = HERE / "flash-0731-reap160"


def _dry_run(ckpt: Path) -> str:
    buf = io.StringIO()
    assert first_token.main(["--checkpoint", str(ckpt), "--dry-run"], console=Console(file=buf, width=250)) == 0
    return buf.getvalue()


def test_every_fixture_names_its_source() -> None:
    for d in sorted(p for p in HERE.iterdir() if p.is_dir()):
        prov = json.loads((d / "PROVENANCE.json").read_text())
        assert prov["read"] and prov["repository"]
        assert set(prov["files"]) == {f.name for f in d.iterdir() if f.name != "PROVENANCE.json"}, d.name
        assert all(f["url"].startswith("https://") for f in prov["files"].values())


def test_reap_index_and_headers_agree() -> None:
    wm = json.loads(gzip.decompress((REAP / "model.safetensors.index.json.gz").read_bytes()))["weight_map"]
    hdr = read_headers(REAP / "headers.json.gz")
    assert {n: s for s, t in hdr.items() for n in t} == wm
    assert len(wm) == 45_821 and len(hdr) == 48


def test_reap_config_needs_the_opt_in_for_its_pruning_record(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"unexpected keys \['reap_pruning'\]"):
        DSV4Config.from_json(REAP / "config.json")
    monkeypatch.setenv(ALLOW_ENV, "1")
    c = DSV4Config.from_json(REAP / "config.json")
    assert "reap_pruning" in c.ignored_keys and c.n_routed_experts == 160 and c.dspark_stages == 3


def test_our_official_dspark_reading_is_the_published_one(monkeypatch) -> None:
    """Every name, dtype and shape the layout derives from the config alone equals the published headers."""
    monkeypatch.setenv(ALLOW_ENV, "1")
    c = DSV4Config.from_json(REAP / "config.json")
    published = {n: v for t in read_headers(REAP / "headers.json.gz").values() for n, v in t.items()}
    ours = expected_tensors(c, "official-dspark")
    assert sorted(set(ours) ^ set(published)) == []
    assert [n for n in ours if ours[n] != published[n]] == []


def test_sparse_checkpoint_from_published_headers_opens_and_plans(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "1")
    out = tmp_path / "reap"
    assert sparse_main(["--preset", str(REAP / "config.json"), "--headers", str(REAP / "headers.json.gz"),
                        "--out", str(out)]) == 0
    assert (out / "config.json").read_bytes() == (REAP / "config.json").read_bytes()   # as published
    r = open_checkpoint(out)   # raises on any missing / unexpected tensor, wrong dtype or shape
    assert r.flavor == "official-dspark" and r.has_mtp and r.config.dspark_stages == 3
    wm = json.loads(gzip.decompress((REAP / "model.safetensors.index.json.gz").read_bytes()))["weight_map"]
    assert r.tensor_names() == sorted(wm)
    assert r.weight_format("mtp.0.main_proj").kind == "fp8_block"
    assert r.weight_format("mtp.2.ffn.experts.159.w2").kind == "mxfp4"
    assert r.weight_format("mtp.2.markov_head.markov_w1").shape == (129280, 256)
    assert r.weight_format("ffn.experts.159.w1", 42).kind == "mxfp4"
    text = _dry_run(out)
    assert "layout official-dspark" in text and "mtp.0.main_proj.weight" in text
    assert "native:default (floor / bug budget)" in text and "reap_pruning" in text


def test_a_published_tensor_renamed_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "1")
    hdr = json.loads(gzip.decompress((REAP / "headers.json.gz").read_bytes()))
    shard = hdr["model-00046-of-00048.safetensors"]
    shard["mtp.0.attn.kv_norm_x.weight"] = shard.pop("mtp.0.attn.kv_norm.weight")
    (tmp_path / "h.json").write_text(json.dumps(hdr))
    out = tmp_path / "bad"
    assert sparse_main(["--preset", str(REAP / "config.json"), "--headers", str(tmp_path / "h.json"),
                        "--out", str(out)]) == 0
    with pytest.raises(CheckpointError, match=r"missing tensors: \['mtp\.0\.attn\.kv_norm\.weight"):
        open_checkpoint(out)


@pytest.mark.parametrize("fixture, name, flavor", [
    ("flash-0731-inference", "flash-0731", "official-dspark"),
    ("flash-april-inference", "flash", "official"),
])
def test_published_official_configs_are_the_presets(fixture, name, flavor, tmp_path) -> None:
    c = DSV4Config.from_json(HERE / fixture / "inference_config.json")
    assert c.replace(name=name) == preset(name)
    if fixture == "flash-april-inference":   # the fork's own n_routed_experts_score is ignored by name
        assert c.ignored_keys == ()
    out = sparse_checkpoint(c, flavor, tmp_path / fixture)   # shapes follow from the config
    r = open_checkpoint(out)
    assert r.flavor == flavor and r.has_mtp
    assert r.config.dspark_stages == (3 if flavor == "official-dspark" else 0)
    assert f"layout {flavor} " in _dry_run(out)


def test_the_two_published_0731_configs_agree_but_for_the_pruning(monkeypatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "1")
    hf = DSV4Config.from_json(REAP / "config.json")
    official = DSV4Config.from_json(HERE / "flash-0731-inference" / "inference_config.json")
    assert hf.replace(name="x", n_routed_experts=256) == official.replace(name="x")


# ---- third-party censuses of the official 0731 / 0813 headers (published/*-census/PROVENANCE.json) ----
def _census(c: DSV4Config) -> dict:
    """The census fields of an inventory, computed from what the official-dspark layout derives from ``c``."""
    from dsv4.checkpoint.sparse import DTYPE_BYTES

    counts: dict[str, int] = {}
    by_dtype: dict[str, int] = {}
    layer: dict[str, dict[str, int]] = {"layer_dense_bytes": {}, "layer_routed_bytes": {}}
    draft = {"draft_dense_bytes": 0, "draft_routed_bytes": 0}
    for name, (dtype, shape) in expected_tensors(c, "official-dspark").items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        counts[dtype] = counts.get(dtype, 0) + 1
        by_dtype[dtype] = by_dtype.get(dtype, 0) + n
        kind = "routed" if ".ffn.experts." in name else "dense"
        if name.startswith("layers."):
            i = name.split(".")[1]
            layer[f"layer_{kind}_bytes"][i] = layer[f"layer_{kind}_bytes"].get(i, 0) + n
        elif name.startswith("mtp."):
            draft[f"draft_{kind}_bytes"] += n
    total = sum(by_dtype.values())
    routed = sum(layer["layer_routed_bytes"].values()) + draft["draft_routed_bytes"]
    return {"tensor_count": sum(counts.values()), "checkpoint_bytes": total, "dtype_tensor_counts": counts,
            "dtype_bytes": by_dtype, "routed_bytes": routed, "dense_bytes": total - routed, **layer, **draft}


@pytest.mark.parametrize("fixture, name", [("pro-0813-census", "pro-0813"), ("flash-0731-census", "flash-0731")])
def test_our_0731_0813_reading_matches_the_published_census(fixture, name) -> None:
    """Name count, dtype per tensor kind, every shape (through the bytes: per dtype, per layer, per
    draft, dense vs routed) of the layout derived from the preset equal the census of the released headers."""
    inv = json.loads((HERE / fixture / "inventory.json").read_text())
    assert inv["repo"].endswith(("Pro-0813", "Flash-0731"))
    ours = _census(preset(name))
    assert {k: inv[k] for k in ours} == ours
    assert inv["header_storage_bytes"] == inv["checkpoint_bytes"]


def test_sparse_pro_0813_opens_as_dspark_and_dry_runs(tmp_path) -> None:
    """A sparse Pro-0813 checkpoint (every tensor the census counts, headers only) is detected, fully
    validated, and dry-runs; its DSpark stages (mtp.0-2, 384 experts each) are recognised."""
    inv = json.loads((HERE / "pro-0813-census" / "inventory.json").read_text())
    out = sparse_checkpoint(preset("pro-0813"), "official-dspark", tmp_path / "pro0813")
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(idx["weight_map"]) == inv["tensor_count"] and idx["metadata"]["total_size"] == inv["checkpoint_bytes"]
    r = open_checkpoint(out)   # raises on any missing / unexpected tensor, wrong dtype or shape
    assert r.flavor == "official-dspark" and r.has_mtp and r.config.dspark_stages == 3
    assert r.config.dspark_target_layer_ids == (58, 59, 60) and r.config.dspark_markov_rank == 512
    assert r.weight_format("mtp.0.main_proj").kind == "fp8_block"
    assert r.weight_format("mtp.2.ffn.experts.383.w2").kind == "mxfp4"
    assert r.weight_format("mtp.2.markov_head.markov_w1").shape == (129280, 512)
    assert r.weight_format("ffn.experts.383.w1", 60).kind == "mxfp4"
    text = _dry_run(out)
    assert "layout official-dspark" in text and "mtp.0.main_proj.weight" in text
    assert "native:default (floor / bug budget)" in text
