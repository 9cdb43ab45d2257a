"""The engine dump format as a contract (docs/engines.md): the writer's manifests satisfy the
published schema, and every kind of mismatch is one clear error naming the dump and what differs."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from safetensors.torch import save_file

from parity.dumps import MANIFEST, SCHEMA, TENSORS, read_dump, write_dump
from parity.errors import DumpError

T, V, D = 5, 11, 8


def _probes() -> dict[str, torch.Tensor]:
    return {"embed": torch.randn(T, D), "layers.0.ffn.router.topk_ids": torch.zeros(T, 2, dtype=torch.int64),
            "layers.1.attn.compressed_kv": torch.randn(2, D), "logits": torch.randn(T, V)}


def _dump(tmp_path: Path) -> Path:
    return write_dump(tmp_path / "d", _probes(), engine="test-engine", token_ids=list(range(T)), prompt_mode="chat",
                      prompt_id="chat-capital")


def test_the_writers_manifest_satisfies_the_schema(tmp_path: Path) -> None:
    d = _dump(tmp_path)
    jsonschema.validate(json.loads((d / MANIFEST).read_text()), json.loads(SCHEMA.read_text()))
    assert set(read_dump(d).probes) == set(_probes())


def _edit_manifest(d: Path, **changes) -> None:
    m = json.loads((d / MANIFEST).read_text())
    m.update(changes)
    (d / MANIFEST).write_text(json.dumps({k: v for k, v in m.items() if v is not ...}))


@pytest.mark.parametrize("changes, message", [
    ({"format_version": 2}, "format_version: 1 was expected"),
    ({"token_ids": ["1", "2"]}, "token_ids/0: '1' is not of type 'integer'"),
    ({"prompt_mode": "reasoning"}, "prompt_mode: 'reasoning' is not one of"),
    ({"engine": ...}, "'engine' is a required property"),
    ({"extra_key": 1}, "Additional properties are not allowed ('extra_key' was unexpected)"),
])
def test_a_manifest_off_the_schema_is_one_error_with_its_path(tmp_path: Path, changes, message) -> None:
    d = _dump(tmp_path)
    _edit_manifest(d, **changes)
    with pytest.raises(DumpError, match="dump_manifest.schema.json") as e:
        read_dump(d)
    assert message in str(e.value) and str(d) in str(e.value)


@pytest.mark.parametrize("name, tensor, message", [
    ("logits", torch.randn(T + 1, V), f"expected {T} rows (one per token of token_ids), found shape [{T + 1}, {V}]"),
    ("embed", torch.randn(T, D).to(torch.int32), "expected a floating dtype, found int32"),
    ("layers.0.ffn.router.topk_ids", torch.zeros(T, 2), "expected an integer dtype, found float32"),
    ("embed", torch.tensor(1.0), "found a scalar"),
])
def test_token_count_and_dtype_mismatches_are_named(tmp_path: Path, name, tensor, message) -> None:
    d = _dump(tmp_path)
    save_file({**_probes(), name: tensor}, str(d / TENSORS))
    with pytest.raises(DumpError, match=f"probe {name}") as e:
        read_dump(d)
    assert message in str(e.value)


def test_entry_probes_keep_their_own_row_count_and_a_missing_probe_is_named(tmp_path: Path) -> None:
    d = _dump(tmp_path)
    assert read_dump(d).probes["layers.1.attn.compressed_kv"].shape == (2, D)   # N entries, not T tokens
    p = _probes()
    del p["embed"]
    save_file(p, str(d / TENSORS))
    with pytest.raises(DumpError, match=r"manifest lists probes missing from probes.safetensors: \['embed'\]"):
        read_dump(d)
