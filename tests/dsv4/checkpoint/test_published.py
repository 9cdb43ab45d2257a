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
