"""The run behind ``python -m reference.training.draft`` (its CLI, torch-free for a fast --help, is
:mod:`.draft`): training, the 0731 checkpoint, and the measured acceptance length."""
from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path

import torch

from dsv4.checkpoint.builtin import trained_path
from dsv4.checkpoint.reader import open_checkpoint
from dsv4.checkpoint.synth import build_tensors, synthetic_values, write_checkpoint
from dsv4.config import with_dspark
from dsv4.tokenizer import load_tokenizer

from ..dspark import DSparkReference
from ..model import load_model
from . import corpus
from .draft_settings import DraftSettings
from .draft_loop import FLAVOR, DraftWeights, train_draft
from .run import _git, _log, _stream


def _trunk_values(reader):
    from ..dequant import dequantize

    return lambda spec: dequantize(reader.weight(spec.full_name)).numpy()


def _with_stored_target(tensors: dict, src: Path) -> dict:
    """The target's tensors exactly as tiny-trained stores them: re-encoding their dequantized values
    would pick other FP8 block scales for some blocks, i.e. another target than the draft learned."""
    from safetensors import safe_open

    with safe_open(src / "model.safetensors", "pt") as f:
        stored = {k: f.get_tensor(k) for k in f.keys()}
    missing = set(stored) - set(tensors)
    if missing:
        raise ValueError(f"the 0731 layout names the target's tensors as tiny-trained does: expected them all, "
                         f"missing {sorted(missing)[:3]}")
    return {**tensors, **stored}


def _standard_prompts() -> list[dict]:
    """The standard prompt set read as data: the reference may not import dsv4.prompts (design
    principle 2); the set's validation is dsv4.prompts' job and its tests'."""
    import tomllib
    from importlib import resources

    return tomllib.loads(resources.files("dsv4").joinpath("data", "prompts.toml").read_text("utf-8"))["prompts"]


def measure_acceptance(checkpoint: Path, n_tokens: int = 32) -> dict:
    """Greedy speculation of the reference (fp32) on the standard prompts of both modes: mean τ and
    the per-position acceptance rate, with the losslessness check on each prompt."""
    from dsv4.encoding import encode_messages

    model = load_model(checkpoint, dtype=torch.float32)
    ds, tok = DSparkReference(model), load_tokenizer(checkpoint)
    acc, lossless = [], True
    for p in _standard_prompts():
        ids = torch.tensor(tok.encode(encode_messages([dict(m) for m in p["messages"]], thinking_mode=p["mode"]),
                                      max_id=model.config.vocab_size - 1))
        res = ds.generate(ids, n_tokens)
        logits, st = model.prefill(ids)
        plain = [int(torch.argmax(logits[-1]))]
        while len(plain) < n_tokens:
            plain.append(int(torch.argmax(model.decode_step(st, plain[-1]))))
        lossless &= plain == res.tokens
        acc += res.accepted
    g = ds.gamma
    return {"prompts": "dsv4/data/prompts.toml (all)", "tokens_per_prompt": n_tokens, "verify_steps": len(acc),
            "mean_tau": sum(a + 1 for a in acc) / len(acc),
            "position_rates": [sum(a >= j for a in acc) / len(acc) for j in range(1, g + 1)], "lossless": lossless}


def run_draft_training(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    src = trained_path("tiny-trained", "official")
    reader = open_checkpoint(src)
    c = with_dspark(reader.config).replace(name="tiny-trained-dspark")
    tok = load_tokenizer(src)
    trunk = _trunk_values(reader)
    init = out / "init"
    if not (init / "config.json").exists():
        write_checkpoint(init, c, build_tensors(c, FLAVOR, values=lambda s: synthetic_values(s, c, a.seed)
                                                if s.mtp is not None else trunk(s)), FLAVOR, tokenizer=tok)
    model = load_model(init, dtype=torch.float32)
    weights = DraftWeights(model.store, c, a.seed)
    model.store = weights
    ds = DSparkReference(model)
    docs = corpus.load_docs(corpus.read_manifest())
    train_ids, held_ids = _stream(tok, docs, False), _stream(tok, docs, True)
    s = DraftSettings(steps=a.steps, seq_len=a.seq_len, anchors=a.anchors, lr=a.lr, seed=a.seed)
    n_params = sum(p.numel() for _, p in weights.parameters() if p.requires_grad)
    _log(f"draft of {c.name}: {c.dspark_stages} stages, γ={c.dspark_block_size}, target layers "
         f"{list(c.dspark_target_layer_ids)}, {n_params:,} trained parameters; {s.steps} steps x {s.anchors} anchors")
    t0 = time.time()
    curve = train_draft(ds, weights, train_ids, held_ids, s, tok.bos_id, out / "train_state.pt", _log)
    minutes = (time.time() - t0) / 60
    ckpt = out / "official"
    params = {n: p.detach().float().numpy() for n, p in weights.parameters()}
    tensors = build_tensors(c, FLAVOR, values=lambda s_: params[s_.full_name] if s_.mtp is not None else trunk(s_))
    write_checkpoint(ckpt, c, _with_stored_target(tensors, src), FLAVOR, tokenizer=tok)
    _log(f"wrote {ckpt}; measuring greedy acceptance on the standard prompts")
    acceptance = measure_acceptance(ckpt)
    _log(f"mean τ {acceptance['mean_tau']:.3f}, per position {acceptance['position_rates']}, "
         f"lossless {acceptance['lossless']}")
    (out / "draft_curve.csv").write_text("step,loss,held_out_teacher_forced_tau\n" + "".join(
        f"{st},{l:.5f},{dict(curve.held_out_tau).get(st, '')}\n" for st, l in zip(curve.step, curve.loss)))
    prov = {
        "model": c.name, "target": "tiny-trained (dsv4/data/models/tiny-trained-official, weights unchanged)",
        "target_tensors_sha256": hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest(),
        "dspark": {"stages": c.dspark_stages, "block_size": c.dspark_block_size,
                   "target_layer_ids": list(c.dspark_target_layer_ids), "markov_rank": c.dspark_markov_rank,
                   "noise_token_id": c.dspark_noise_token_id},
        "trained_parameters": n_params, "settings": vars(s), "anchors_seen": s.steps * s.anchors,
        "objective": "cross entropy toward the target's greedy next token per block row (Markov chain forced to "
                     "the target's tokens) + 0.1 x confidence BCE toward row correctness; target frozen",
        "held_out_teacher_forced_tau": curve.held_out_tau, "acceptance": acceptance,
        "code_version": _git(), "torch": torch.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "train_minutes": round(minutes, 1), "layout": FLAVOR,
    }
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    _log(f"done in {minutes:.1f} min: {out / 'provenance.json'}")
    return 0
