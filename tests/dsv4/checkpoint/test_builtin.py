"""The trained tiny model shipped in the repository: it resolves by name, its files are what its
provenance says, and its NVFP4 form is what the project's converter writes from the official one."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from dsv4.checkpoint import CheckpointError, open_checkpoint
from dsv4.checkpoint.builtin import MODELS_DIR, TRAINED, provenance_path, trained_name, trained_path
from dsv4.checkpoint.convert import convert
from dsv4.checkpoint.synth import resolve_preset
from dsv4.config import load_config

NAME = "tiny-trained"


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if not f.name.startswith(".")}


def test_the_name_resolves_to_the_shipped_layouts_and_nothing_else() -> None:
    assert resolve_preset(NAME) == trained_path(NAME) == MODELS_DIR / "tiny-trained"
    assert open_checkpoint(trained_path(NAME)).flavor == "nvidia-nvfp4"
    assert open_checkpoint(trained_path(NAME, "official")).flavor == "official"
    assert load_config(NAME).name == NAME and load_config(NAME).vocab_size == 4096
    with pytest.raises(CheckpointError, match="one set of weights"):
        resolve_preset(NAME, seed=1)
    with pytest.raises(CheckpointError, match="dsv4.checkpoint.convert"):
        trained_path(NAME, "compressed-tensors")
    assert trained_name(NAME) == trained_name(str(trained_path(NAME, "official"))) == NAME
    assert trained_name("tiny") is None and trained_name("/nowhere") is None


def test_files_fit_the_repository_budget() -> None:
    files = [f for d in TRAINED[NAME].values() for f in (MODELS_DIR / d).iterdir()]
    assert sum(f.stat().st_size for f in files) <= 20 * 1000 * 1000
    assert max(f.stat().st_size for f in files) <= 16 * 1024 * 1024


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
    assert _digest(out) == _digest(trained_path(NAME))


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
