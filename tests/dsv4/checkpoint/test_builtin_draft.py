"""The trained tiny model's 0731 form (``tiny-trained-dspark``): it resolves by name, its target
weights are tiny-trained's bit for bit, its NVFP4 form is the converter's output, and its draft has
learned what its provenance says (the reference's greedy acceptance on the standard prompts)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.builtin import official_path, provenance_path, trained_path
from dsv4.checkpoint.builtin_derive import derived_dir, recipes
from dsv4.checkpoint.convert import convert
from dsv4.checkpoint.synth import resolve_preset

NAME = "tiny-trained-dspark"


def test_the_name_resolves_to_a_0731_checkpoint_with_a_draft() -> None:
    assert resolve_preset(NAME) == trained_path(NAME) == derived_dir(NAME)
    r = open_checkpoint(trained_path(NAME))
    assert r.flavor == "nvidia-nvfp4" and r.config.dspark_block_size == 5 and r.config.name == NAME
    assert open_checkpoint(official_path(NAME)).flavor == "official-dspark"
    assert official_path("tiny-trained") == trained_path("tiny-trained", "official")


def test_the_target_weights_are_tiny_trained_unchanged() -> None:
    prov = json.loads(provenance_path(NAME).read_text())
    src = trained_path("tiny-trained", "official") / "model.safetensors"
    assert prov["target_tensors_sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    with safe_open(src, "pt") as a, safe_open(official_path(NAME) / "model.safetensors", "pt") as b:
        names = set(a.keys())
        assert names < set(b.keys()) and all(k.startswith("mtp.") for k in set(b.keys()) - names)
        for k in sorted(names):
            assert a.get_tensor(k).equal(b.get_tensor(k)), k


def test_the_nvfp4_form_is_the_converters_output(tmp_path: Path) -> None:
    out = convert(official_path(NAME), "nvidia-nvfp4", tmp_path / "nv")
    digest = lambda d: {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())  # noqa: E731
                        if not f.name.startswith(".")}
    assert digest(out) == digest(trained_path(NAME)) == recipes()[NAME]["sha256"]


@pytest.mark.slow   # ~15 s: greedy speculation of the reference on every standard prompt
def test_the_draft_has_learned_what_its_provenance_says() -> None:
    from reference.training.draft_run import measure_acceptance

    prov = json.loads(provenance_path(NAME).read_text())["acceptance"]
    got = measure_acceptance(official_path(NAME), prov["tokens_per_prompt"])
    assert got["lossless"] and prov["lossless"]
    assert 1.3 < got["mean_tau"] < 3.0                       # well above 1 (random draft: ~1.0), well below γ + 1
    # the same code on another CPU may round a near tie differently: a few steps, not the figure
    assert got["mean_tau"] == pytest.approx(prov["mean_tau"], abs=0.05)
