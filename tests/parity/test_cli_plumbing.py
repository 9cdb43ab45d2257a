"""CLI plumbing with fake models: exit codes 0 / 1 / 2, outputs, dry run, untokenizable prompts."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from dsv4.tokenizer import SPECIAL_TOKENS
from parity import check, first_token
from parity.records import read_records

from .fakes import FakeLoaders

LOOSE = """
[[rule]]
probe = '.*'
metric = "cosine"
op = ">="
value = 0.5
"""
STRICT = LOOSE.replace("0.5", "0.9999999")


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, force_terminal=False), buf


def _on_tiny(args: list[str]) -> list[str]:
    """These harness tests run on the synthetic tiny checkpoint (the fixtures' source), not the default."""
    return args if "--checkpoint" in args else ["--checkpoint", "tiny", *args]


def _run(args: list[str], loaders=None) -> tuple[int, str]:
    con, buf = _console()
    rc = first_token.main(_on_tiny(args), loaders=loaders, console=con)
    return rc, buf.getvalue()


@pytest.fixture
def rules(tmp_path: Path) -> tuple[Path, Path]:
    loose, strict = tmp_path / "loose.toml", tmp_path / "strict.toml"
    loose.write_text(LOOSE)
    strict.write_text(STRICT)
    return loose, strict


def test_pass_and_fail_exit_codes_and_outputs(tiny, rules, tmp_path: Path) -> None:
    loose, strict = rules
    recs, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    rc, out = _run(["--prompt", "chat-capital", "--rules", str(loose), "--records", str(recs), "--json",
                    str(summary)], FakeLoaders(tiny.fingerprint))
    assert rc == 0, out
    assert "KL(reference || test)" in out and "PASS" in out and "chat-capital" in out
    assert "absent: no kernel backend executes on cpu" in out
    s = json.loads(summary.read_text())
    assert s["verdict"]["passed"] and s["columns"]["bug_budget"]["ran"] is False
    assert [f["mode"] for f in s["timing"]["forwards"]].count("isolated") == 2
    df = read_records(recs)
    assert set(df["pair"]) == {"logic", "floor"} and set(df["prompt_id"]) == {"chat-capital", "*"}
    rc, out = _run(["--prompt", "chat-capital", "--rules", str(strict)], FakeLoaders(tiny.fingerprint, fp4_noise=0.1))
    assert rc == 1 and "would pass at" in out and "FAIL" in out


@pytest.mark.parametrize("args, message", [
    (["--plan", "no-such-plan"], "plan"),
    (["--plan", "/nonexistent/plan.toml"], "plan"),
    (["--backend", "cutedsl_sm90"], "cannot execute"),
    (["--backend", "nope"], "backend"),
    (["--checkpoint", "/nonexistent/ckpt"], "checkpoint"),
    (["--checkpoint", "flash"], "real preset"),
    (["--prompt", "thinking-train"], "thinking"),
    (["--device", "cuda:3"], "CUDA"),
    (["--device-map", "{not json"], "device-map"),
    (["--columns", "logic,other"], "columns"),
])
def test_bad_input_exits_2_before_loading_models(tiny, args: list[str], message: str) -> None:
    loaders = FakeLoaders(tiny.fingerprint)
    rc, out = _run(["--mode", "chat", *args], loaders)
    assert rc == 2, out
    assert message in out
    assert loaders.built == []


def test_bad_rules_file_exits_2(tiny, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(LOOSE.replace("'.*'", "'layers\\\\.0\\\\.nothing'"))
    rc, out = _run(["--rules", str(bad)], FakeLoaders(tiny.fingerprint))
    assert rc == 2 and "unknown probe" in out


def test_dry_run_loads_nothing_and_estimates_memory(tmp_path: Path) -> None:
    class NoLoad:
        def reference(self, *a, **k):
            raise AssertionError("dry run loaded a model")

        native = reference

    out_json = tmp_path / "dry.json"
    rc, out = _run(["--dry-run", "--checkpoint", "flash", "--device", "cuda:0", "--device-map",
                    '{"embed": "cuda:0", "head": "cuda:1"}', "--json", str(out_json)], NoLoad())
    assert rc == 0, out
    est = json.loads(out_json.read_text())["dry_run"]
    ref = next(m for m in est["models"] if m["model"] == "reference")
    fp4 = next(m for m in est["models"] if m["model"].startswith("native:default"))
    assert set(ref["per_device"]) == {"cuda:0", "cuda:1"}
    assert fp4["total"] < ref["total"] / 2   # NVFP4 experts: far below the dequantized BF16 reference
    assert est["peak_per_device"]["cuda:0"] == max(m["per_device"]["cuda:0"] for m in est["models"])


def _wordlevel_checkpoint(tiny, tmp_path: Path) -> Path:
    """The tiny checkpoint with a word-level tokenizer that knows only a few words (and [UNK])."""
    d = tmp_path / "ckpt"
    d.mkdir()
    for f in tiny.path.iterdir():
        if f.suffix in (".json", ".safetensors") and f.name != "tokenizer.json":
            shutil.copy(f, d / f.name)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab.update({w: len(vocab) + n for n, w in enumerate(["hello", "[UNK]"])})
    vocab.update({f"filler{k}": k for k in range(len(vocab), tiny.config.vocab_size)})   # fits the model
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.save(str(d / "tokenizer.json"))
    return d


def test_a_prompt_the_tokenizer_cannot_encode_exits_2(tiny, tmp_path: Path) -> None:
    ckpt = _wordlevel_checkpoint(tiny, tmp_path)
    loaders = FakeLoaders(tiny.fingerprint)
    rc, out = _run(["--checkpoint", str(ckpt), "--prompt", "zebra crossing"], loaders)
    assert rc == 2 and "cannot be encoded" in out and loaders.built == []


def test_check_cli(tiny, rules, tmp_path: Path) -> None:
    loose, strict = rules
    recs = tmp_path / "r.jsonl"
    assert _run(["--prompt", "chat-explain", "--rules", str(loose), "--records", str(recs)],
                FakeLoaders(tiny.fingerprint))[0] == 0
    con, buf = _console()
    assert check.main([str(recs), "--rules", str(loose)], console=con) == 0
    con, buf = _console()
    assert check.main([str(recs), "--rules", str(strict)], console=con) == 1
    assert "would pass at" in buf.getvalue()
    # records of another checkpoint mixed in: bad input
    other = tmp_path / "other.jsonl"
    other.write_text(recs.read_text().replace(tiny.fingerprint, "0" * 64))
    con, buf = _console()
    assert check.main([str(recs), str(other), "--rules", str(loose)], console=con) == 2
    assert "one checkpoint" in buf.getvalue()
    # another plan for the floor pair mixed in: bad input
    plan = tmp_path / "plan.jsonl"
    plan.write_text(recs.read_text().replace('"plan": "default"', '"plan": "all-fp4"'))
    con, buf = _console()
    assert check.main([str(recs), str(plan), "--rules", str(loose)], console=con) == 2
    assert "one plan" in buf.getvalue()
    con, buf = _console()
    assert check.main([str(tmp_path / "none.jsonl"), "--rules", str(loose)], console=con) == 2
    bad_rules = tmp_path / "bad.toml"
    bad_rules.write_text("[[rule]\n")
    con, buf = _console()
    assert check.main([str(recs), "--rules", str(bad_rules)], console=con) == 2


def test_check_creates_nothing_from_its_input_paths(tiny, rules, tmp_path: Path, monkeypatch) -> None:
    """The positional records are inputs: the output-path check once made a directory named after the
    list of them ("['/tmp/...r.jsonl']") in the working directory."""
    loose, _ = rules
    recs = tmp_path / "r.jsonl"
    assert _run(["--prompt", "chat-explain", "--rules", str(loose), "--records", str(recs)],
                FakeLoaders(tiny.fingerprint))[0] == 0
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    con, _ = _console()
    assert check.main([str(recs), "--rules", str(loose)], console=con) == 0
    assert list(work.iterdir()) == []
