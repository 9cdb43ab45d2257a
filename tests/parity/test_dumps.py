"""The engine dump format and compare_dumps: round trip, and every bad-input path exits 2."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file, save_file

from parity import compare_dumps, dumps
from parity.errors import DumpError
from parity.dumps import dump_from_native, read_dump, write_dump

from .fakes import FakeLoaders, FakeModel

LOOSE = "[[rule]]\nprobe = '.*'\nmetric = 'cosine'\nop = '>='\nvalue = 0.5\n"


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


@pytest.fixture
def fake_dumps(tiny, chat_prompts, tmp_path: Path) -> Path:
    out = tmp_path / "dumps"
    dump_from_native(FakeModel(tiny.config, tiny.fingerprint, noise=0.01), chat_prompts, out, engine="fake-engine")
    return out


def _compare(tiny, path: Path, tmp_path: Path, rules: str = LOOSE) -> tuple[int, str]:
    r = tmp_path / "rules.toml"
    r.write_text(rules)
    con, buf = _console()
    rc = compare_dumps.main(["--checkpoint", "tiny", "--dumps", str(path), "--rules", str(r), "--json", str(tmp_path / "v.json")],
                            loaders=FakeLoaders(tiny.fingerprint), console=con)
    return rc, buf.getvalue()


def test_write_read_round_trip(tiny, chat_prompts, tmp_path: Path) -> None:
    (path,) = dump_from_native(FakeModel(tiny.config, tiny.fingerprint), chat_prompts[:1], tmp_path, engine="e")
    d = read_dump(path)
    assert d.engine == "e" and d.token_ids == list(chat_prompts[0].ids) and d.prompt_mode == "chat"
    assert d.manifest["dtype"] == "bfloat16" and list(d.probes)[0] == "embed"
    assert d.probes["logits"].dtype == torch.float32


def test_compare_dumps_passes_and_names_the_engine(tiny, fake_dumps: Path, tmp_path: Path) -> None:
    rc, out = _compare(tiny, fake_dumps, tmp_path)
    assert rc == 0, out
    assert "engine fake-engine" in out and "first failing probe (propagated" in out
    assert json.loads((tmp_path / "v.json").read_text())["verdict"]["passed"]


def _edit_tensors(path: Path, edit) -> None:
    t = load_file(str(path / "probes.safetensors"))
    edit(t)
    save_file(t, str(path / "probes.safetensors"))


def test_missing_probe_exits_2(tiny, fake_dumps: Path, tmp_path: Path) -> None:
    one = sorted(fake_dumps.iterdir())[0]
    _edit_tensors(one, lambda t: t.pop("layers.3.attn.indexer.topk"))
    m = json.loads((one / "manifest.json").read_text())
    m["probes"].remove("layers.3.attn.indexer.topk")
    (one / "manifest.json").write_text(json.dumps(m))
    rc, out = _compare(tiny, fake_dumps, tmp_path)
    assert rc == 2 and "missing probes" in out and "layers.3.attn.indexer.topk" in out


def test_mismatched_shape_exits_2(tiny, fake_dumps: Path, tmp_path: Path) -> None:
    one = sorted(fake_dumps.iterdir())[0]
    _edit_tensors(one, lambda t: t.update({"layers.0.attn.q": t["layers.0.attn.q"][:, :2].contiguous()}))
    rc, out = _compare(tiny, fake_dumps, tmp_path)
    assert rc == 2 and "shapes differ" in out and "layers.0.attn.q" in out


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(token_ids=m["token_ids"][:-1]), "rows (one per token of token_ids)"),
    (lambda m: m.update(token_ids=[*m["token_ids"][:-1], 99999]), "outside the vocabulary"),
    (lambda m: m.update(prompt_mode="thinking"), "manifest says"),
    (lambda m: m.update(format_version=7), "version"),
    (lambda m: m.pop("engine"), "'engine' is a required property"),
])
def test_bad_manifest_exits_2(tiny, fake_dumps: Path, tmp_path: Path, edit, message: str) -> None:
    one = sorted(fake_dumps.iterdir())[0]
    m = json.loads((one / "manifest.json").read_text())
    edit(m)
    (one / "manifest.json").write_text(json.dumps(m))
    rc, out = _compare(tiny, fake_dumps, tmp_path)
    assert rc == 2 and message in out


def test_custom_prompt_text_must_match_its_ids(tiny, tmp_path: Path) -> None:
    text = "<｜begin▁of▁sentence｜><｜User｜>hello<｜Assistant｜></think>"
    ids = tiny.tokenizer.encode(text)
    model = FakeModel(tiny.config, tiny.fingerprint)
    from parity.runner import run_propagated

    probes = run_propagated(model, torch.tensor(ids)).probes
    write_dump(tmp_path / "d", probes, engine="x", token_ids=ids, prompt_mode="chat", prompt_id="my-prompt",
               prompt_text=text)
    assert _compare(tiny, tmp_path / "d", tmp_path)[0] == 0
    write_dump(tmp_path / "d", probes, engine="x", token_ids=ids, prompt_mode="chat", prompt_id="my-prompt",
               prompt_text=text + " more")
    rc, out = _compare(tiny, tmp_path / "d", tmp_path)
    assert rc == 2 and "prompt_text" in out


def test_write_dump_rejects_unknown_probe_names(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match="unknown probe"):
        write_dump(tmp_path / "x", {"layers.0.mystery": torch.zeros(1)}, engine="e", token_ids=[1], prompt_mode="chat")


def test_no_dumps_found_exits_2(tiny, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    rc, out = _compare(tiny, tmp_path / "empty", tmp_path)
    assert rc == 2 and "manifest.json" in out


def test_from_native_cli_writes_one_dump_per_prompt(tiny, tmp_path: Path) -> None:
    con, buf = _console()
    rc = dumps.main(["--checkpoint", "tiny", "--from-native", "--prompt", "chat-capital", "--prompt", "chat-explain", "--out",
                     str(tmp_path / "o")], loaders=FakeLoaders(tiny.fingerprint), console=con)
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["chat-capital", "chat-explain"]
