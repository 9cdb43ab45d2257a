"""The training harness (reference/training): it trains the reference's own math, nothing else."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import reference
from dsv4 import probes
from dsv4.checkpoint.names import INDEX
from dsv4.tokenizer import SPECIAL_TOKENS
from reference.training import corpus
from reference.training.bpe import train_bpe
from reference.training.loop import TrainSettings, balance_bias, lr_at
from reference.training.params import NO_GRADIENT, TrainableWeights, forward, trainable_model, trains


def _weights_of(model: reference.ReferenceModel) -> TrainableWeights:
    """Trainable weights holding exactly the values the model reads from its checkpoint."""
    store = model.store

    def init(spec):
        t = store.get(spec.name, spec.layer, "cpu", True)
        return t.numpy() if spec.kind == INDEX else t.float().numpy()

    return TrainableWeights(model.config, init)


def test_trainable_forward_is_the_reference_forward(tiny_path: Path) -> None:
    ids = torch.arange(48) % 512
    want = reference.load_model(tiny_path, dtype=torch.float32).prefill(ids)[0]
    m = reference.load_model(tiny_path, dtype=torch.float32)
    got = forward(trainable_model(m, _weights_of(m)), ids)
    assert got.requires_grad
    assert torch.equal(got.detach(), want)   # the same code on the same values: bit for bit


def test_gradients_reach_every_trained_weight_and_only_those(tiny_path: Path) -> None:
    m = reference.load_model(tiny_path, dtype=torch.float32)
    w = _weights_of(m)
    ids = torch.arange(64) % 512
    with probes.ProbeRecorder(include=r"router\.topk_ids$") as rec:
        F.cross_entropy(forward(trainable_model(m, w), ids)[:-1], ids[1:]).backward()
    chosen = {f"layers.{n.split('.')[1]}.ffn.experts.{e}." for n in rec for e in rec[n].unique().tolist()}
    for name, p in w.parameters():
        leaf = name.split(".", 2)[-1] if name.startswith("layers.") else name
        if ".ffn.experts." in name and not name.startswith(tuple(chosen)):
            assert p.grad is None, name   # a routed expert no token selected
        elif trains(leaf):
            assert p.grad is not None and bool(torch.isfinite(p.grad).all()) and float(p.grad.abs().sum()) > 0, name
        else:
            assert p.grad is None, name
    assert any(not trains(n) for n in ("ffn.gate.bias", "attn.indexer.wq_b")) and NO_GRADIENT


def test_balance_bias_favours_the_underloaded_experts(tiny_path: Path) -> None:
    m = reference.load_model(tiny_path, dtype=torch.float32)
    w = _weights_of(m)
    layer = next(i for i in range(m.config.num_hidden_layers) if not m.config.is_hash_layer(i))
    before = w.get("ffn.gate.bias", layer, "cpu").detach().clone()
    rec = probes.ProbeRecorder()
    rec._take(f"layers.{layer}.ffn.router.topk_ids", torch.zeros(10, 2, dtype=torch.int64))   # all on expert 0
    rec._take("layers.0.ffn.router.topk_ids", torch.zeros(10, 2, dtype=torch.int64))          # hash layer: no bias
    balance_bias(w, rec, m.config)
    step = w.get("ffn.gate.bias", layer, "cpu").detach() - before
    assert float(step[0]) < 0 and bool((step[1:] > 0).all())


def test_lr_schedule_warms_up_then_decays_to_a_tenth() -> None:
    s = TrainSettings(steps=100, warmup=10, lr=1.0)
    assert lr_at(s, 0) == pytest.approx(0.1) and lr_at(s, 9) == pytest.approx(1.0)
    assert lr_at(s, 99) == pytest.approx(0.1, abs=1e-3) and lr_at(s, 50) < lr_at(s, 20)


def test_corpus_refuses_files_that_are_not_the_recorded_ones(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "pydoc_data").mkdir()
    (tmp_path / "pydoc_data" / "topics.py").write_text("topics = {}\n")
    m = corpus.build_manifest(tmp_path)
    assert [d["path"] for d in m["files"]] == ["a.py", "pydoc_data/topics.py"]
    assert [t for _, t in corpus.load_docs(m, tmp_path)] == ["x = 1\n", "topics = {}\n"]
    (tmp_path / "a.py").write_text("x = 2\n")
    with pytest.raises(corpus.CorpusError, match="a.py"):
        corpus.load_docs(m, tmp_path)


def test_recorded_corpus_manifest_is_complete() -> None:
    m = corpus.read_manifest()
    assert m["files"] and all(len(d["sha256"]) == 64 for d in m["files"])
    assert sum(d["size"] for d in m["files"]) == m["total_bytes"]
    assert 0 < sum(d["held_out"] for d in m["files"]) < len(m["files"])


def test_bpe_puts_the_specials_first_as_single_tokens() -> None:
    text = "def f(x):\n    return x + 1\n" * 50 + "The answer is in the question. " * 50
    tok = train_bpe([text], 400)
    assert [tok.tokenizer.token_to_id(s) for s in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    ids = tok.encode(SPECIAL_TOKENS[2] + "def f(x):" + SPECIAL_TOKENS[3])
    assert ids[0] == 2 and ids[-1] == 3 and tok.decode(ids) == SPECIAL_TOKENS[2] + "def f(x):" + SPECIAL_TOKENS[3]
    assert tok.vocab_size <= 400


def test_a_few_steps_lower_the_loss_and_write_a_loadable_checkpoint(tmp_path: Path, monkeypatch) -> None:
    from argparse import Namespace

    from reference.training import run

    root = tmp_path / "stdlib"
    (root / "pydoc_data").mkdir(parents=True)
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 200)
    (root / "pydoc_data" / "topics.py").write_text("topics = {'a': 'The answer is here.'}\n" * 200)
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps(corpus.build_manifest(root)))
    monkeypatch.setattr(corpus, "MANIFEST", manifest)
    monkeypatch.setattr(corpus, "stdlib_dir", lambda: root)
    out = tmp_path / "run"
    rc = run.run_training(Namespace(out=str(out), steps=12, seq_len=32, vocab=400, lr=3e-3, seed=0, threads=0,
                                    new_corpus=False))
    assert rc == 0
    prov = json.loads((out / "provenance.json").read_text())
    curve = prov["held_out_curve"]
    assert curve[-1][1] < np.log(prov["config"]["vocab_size"])   # below a uniform guess
    assert prov["tokens_seen"] == 12 * 32 and prov["corpus"]["files"]
    m = reference.load_model(out / "official", dtype=torch.float32)
    assert m.config.vocab_size == prov["config"]["vocab_size"] and m.reader.flavor == "official"
