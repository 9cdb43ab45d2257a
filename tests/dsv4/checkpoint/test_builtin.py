"""The trained tiny model shipped in the repository: it resolves by name, its files are what its
provenance says, and its NVFP4 form is what the project's converter writes from the official one
(derived on first use, never shipped: builtin_derive)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from dsv4.checkpoint import CheckpointError, open_checkpoint
from dsv4.checkpoint.builtin import MODELS_DIR, provenance_path, trained_name, trained_path
from dsv4.checkpoint.builtin_derive import derived_dir, recipes
from dsv4.checkpoint.convert import convert
from dsv4.checkpoint.synth import resolve_preset
from dsv4.config import load_config

NAME = "tiny-trained"


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if not f.name.startswith(".")}


def test_the_name_resolves_to_the_shipped_layouts_and_nothing_else() -> None:
    assert resolve_preset(NAME) == trained_path(NAME) == derived_dir("tiny-trained")
    assert trained_path(NAME, "official") == MODELS_DIR / "tiny-trained-official"
    assert open_checkpoint(trained_path(NAME)).flavor == "nvidia-nvfp4"
    assert open_checkpoint(trained_path(NAME, "official")).flavor == "official"
    assert load_config(NAME).name == NAME and load_config(NAME).vocab_size == 4096
    with pytest.raises(CheckpointError, match="one set of weights"):
        resolve_preset(NAME, seed=1)
    with pytest.raises(CheckpointError, match="dsv4.checkpoint.convert"):
        trained_path(NAME, "compressed-tensors")
    assert trained_name(NAME) == trained_name(str(trained_path(NAME, "official"))) == NAME
    assert trained_name("tiny") is None and trained_name("/nowhere") is None


def test_every_model_is_shipped_once_within_the_repository_budget() -> None:
    # every device call sends the tracked tree: the trained models stay well under its 20 MB budget
    files = [f for f in MODELS_DIR.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= 15 * 1000 * 1000
    assert max(f.stat().st_size for f in files) <= 16 * 1024 * 1024
    shipped = {d.name for d in MODELS_DIR.iterdir() if d.is_dir()}
    assert not shipped & set(recipes()), "a derived layout is shipped too"
    assert sum(1 for f in files if f.name == "tokenizer.json") == 1


def test_provenance_matches_the_shipped_files() -> None:
    from reference.training import corpus

    prov = json.loads(provenance_path(NAME).read_text())
    official = trained_path(NAME, "official")
    assert prov["tokenizer_sha256"] == hashlib.sha256((official / "tokenizer.json").read_bytes()).hexdigest()
    assert prov["corpus"] == corpus.read_manifest()
    assert prov["tokens_seen"] == prov["steps"] * prov["seq_len"]
    assert prov["held_out_loss_as_stored"] < prov["held_out_curve"][0][1] < 8.4   # learned: ln(4096) = 8.3


def test_the_nvfp4_form_is_the_converters_output(tmp_path: Path) -> None:
    out = convert(trained_path(NAME, "official"), "nvidia-nvfp4", tmp_path / "nv")
    assert _digest(out) == _digest(trained_path(NAME)) == recipes()["tiny-trained"]["sha256"]


def test_a_derived_layout_is_rebuilt_and_verified_when_missing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DSV4_PARITY_CACHE", str(tmp_path / "cache"))
    built = trained_path(NAME)
    assert built.is_relative_to(tmp_path / "cache") and _digest(built) == recipes()["tiny-trained"]["sha256"]
    assert trained_path(NAME) == built                              # the second use reads it, builds nothing
    assert trained_name(str(built)) == NAME


def test_a_rebuild_with_other_bytes_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    import dsv4.checkpoint.builtin_derive as bd

    monkeypatch.setenv("DSV4_PARITY_CACHE", str(tmp_path / "cache"))
    wrong = {k: dict(v, sha256=dict(v["sha256"], **{"model.safetensors": "0" * 64})) for k, v in recipes().items()}
    monkeypatch.setattr(bd, "recipes", lambda: wrong)
    with pytest.raises(CheckpointError, match="found other bytes in model.safetensors"):
        trained_path(NAME)
    assert not any((tmp_path / "cache").rglob("config.json"))      # nothing half-built left in place


@pytest.mark.slow   # ~15 s: six 512-token windows through the reference
def test_held_out_loss_in_the_provenance_is_what_the_reference_measures() -> None:
    import reference
    from reference.training import corpus
    from reference.training.loop import TrainSettings, held_out_loss
    from reference.training.run import held_out_stream

    prov = json.loads(provenance_path(NAME).read_text())
    s = TrainSettings(**prov["settings"])
    model = reference.load_model(trained_path(NAME, "official"), dtype=torch.float32)
    try:
        stream, bos = held_out_stream(trained_path(NAME, "official"))
    except corpus.CorpusError as e:
        pytest.skip(f"the corpus is {prov['python']}'s stdlib, this interpreter's differs: {e}")
    assert held_out_loss(model, stream, s, bos) == pytest.approx(prov["held_out_loss_as_stored"], rel=1e-5)
