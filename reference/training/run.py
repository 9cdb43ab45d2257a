"""One training run end to end: corpus -> tokenizer -> initial weights -> training -> checkpoint +
provenance. Each step says what it did; the figures land in provenance.json."""
from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from dsv4.checkpoint.synth import build_tensors, synthetic_values, write_checkpoint
from dsv4.config import preset

from ..model import load_model
from . import corpus
from .bpe import train_bpe
from .loop import TrainSettings, held_out_loss, train
from .params import NO_GRADIENT, TrainableWeights, trainable_model

FLAVOR = "official"
HEAD_INIT_GAIN = 0.25   # the synthetic head's logits are deliberately sharp (gain 4); start near uniform


def tiny_trained_config(vocab: int):
    """The tiny preset's shape (every V4 feature active) with the trained vocabulary and no NextN
    block (nothing here trains it)."""
    return preset("tiny").replace(name="tiny-trained", vocab_size=vocab, num_nextn_predict_layers=0)


def _log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def _git() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _stream(tok, docs, held: bool) -> torch.Tensor:
    ids: list[int] = []
    for d, text in docs:
        if d.held_out == held:
            ids += tok.encode(text, max_id=tok.vocab_size - 1) + [tok.eos_id]
    return torch.tensor(ids, dtype=torch.int64)


def held_out_stream(checkpoint: Path) -> tuple[torch.Tensor, int]:
    """The held-out token stream of the recorded corpus under a checkpoint's tokenizer, and its BOS."""
    from dsv4.tokenizer import load_tokenizer

    tok = load_tokenizer(checkpoint)
    return _stream(tok, corpus.load_docs(corpus.read_manifest()), True), tok.bos_id


def run_training(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.new_corpus:
        corpus.MANIFEST.write_text(json.dumps(corpus.build_manifest(), indent=1) + "\n")
        _log(f"recorded a new corpus manifest: {corpus.MANIFEST}")
    manifest = corpus.read_manifest()
    docs = corpus.load_docs(manifest)
    _log(f"corpus: {len(docs)} files, {manifest['total_bytes'] / 1e6:.2f} MB (Python {manifest['python']} stdlib), "
         f"{sum(d.held_out for d, _ in docs)} held out")
    tok = train_bpe((t for d, t in docs if not d.held_out), a.vocab)
    c = tiny_trained_config(tok.vocab_size)
    train_ids, held_ids = _stream(tok, docs, False), _stream(tok, docs, True)
    _log(f"tokenizer: byte-level BPE, {tok.vocab_size} ids; {len(train_ids):,} training / {len(held_ids):,} "
         f"held-out tokens")

    init_dir = out / "init"
    write_checkpoint(init_dir, c, build_tensors(c, FLAVOR, seed=a.seed), FLAVOR, tokenizer=tok)
    model = load_model(init_dir, dtype=torch.float32)
    weights = TrainableWeights(c, lambda s: synthetic_values(s, c, a.seed) * (HEAD_INIT_GAIN if s.name == "head" else 1))
    model = trainable_model(model, weights)
    n_params = sum(p.numel() for _, p in weights.parameters())
    s = TrainSettings(steps=a.steps, seq_len=a.seq_len, lr=a.lr, seed=a.seed)
    _log(f"model: {c.num_hidden_layers} layers {c.compress_ratios}, {n_params:,} parameters; "
         f"{s.steps} steps of {s.seq_len} tokens")
    t0 = time.time()
    curve = train(model, weights, train_ids, held_ids, s, tok.bos_id, out / "train_state.pt", _log)
    minutes = (time.time() - t0) / 60

    ckpt = out / "official"
    write_checkpoint(ckpt, c, build_tensors(c, FLAVOR, values=weights.values), FLAVOR, tokenizer=tok)
    stored = held_out_loss(load_model(ckpt, dtype=torch.float32), held_ids, s, tok.bos_id)
    _log(f"wrote {ckpt}; held-out loss {curve.held_out[-1][1]:.3f} (fp32 weights), {stored:.3f} (as stored: "
         f"FP8 + MXFP4)")
    (out / "loss_curve.csv").write_text("step,train_loss,held_out_loss\n" + "".join(
        f"{st},{l:.5f},{dict(curve.held_out).get(st, '')}\n" for st, l in zip(curve.step, curve.train_loss)))
    tok_sha = hashlib.sha256((ckpt / "tokenizer.json").read_bytes()).hexdigest()
    prov = {
        "model": c.name, "config": {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size,
                                    "layers": c.num_hidden_layers, "compress_ratios": list(c.compress_ratios)},
        "parameters": n_params, "steps": s.steps, "seq_len": s.seq_len, "tokens_seen": s.steps * s.seq_len,
        "settings": vars(s), "seed": a.seed,
        "final_train_loss_mean_last_20": sum(curve.train_loss[-20:]) / len(curve.train_loss[-20:]),
        "held_out_loss_fp32": curve.held_out[-1][1], "held_out_loss_as_stored": stored,
        "held_out_curve": curve.held_out, "no_gradient": list(NO_GRADIENT),
        "corpus": manifest, "tokenizer_sha256": tok_sha, "train_tokens": len(train_ids), "held_out_tokens": len(held_ids),
        "code_version": _git(), "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "threads": torch.get_num_threads(), "train_minutes": round(minutes, 1),
        "layout": FLAVOR,
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    _log(f"done in {minutes:.1f} min: {out / 'provenance.json'}")
    return 0
