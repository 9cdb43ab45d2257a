"""The training of the DSpark draft (``python -m reference.training.draft``): the draft of the trained tiny model
(docs/trained-model.md, docs/dspark.md) against its frozen target, by the reference's own draft code
(``DSparkReference.commit`` and ``draft`` run with autograd on; no second implementation).

Distillation from the target's own next tokens: a window of the corpus runs through the target
(no gradient), giving main_hidden at every position and the target's greedy next token at every
position. For K anchor positions p per window, the draft's rings hold the target's features of the
last W positions before p, the block is [x_p, ν, ..] at p..p+γ-1, and row r is trained (cross entropy)
toward the target's next token at p + r, its Markov correction taken from the target's token before
it (at inference: the drafted one); the confidence head toward whether the row's argmax is right.
The context is corpus text, not the target's own greedy text: rows beyond the first see the corpus
token where inference would see the target's (said in docs/trained-model.md).

Held-out figure (every ``eval_every`` steps): the teacher-forced acceptance length, 1 + the number of
leading rows whose argmax equals the target's token, averaged over held-out anchors."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from dsv4.checkpoint.names import draft_weights
from dsv4.checkpoint.synth import synthetic_values

from ..dspark import DSparkReference
from .draft_settings import DraftSettings
from .loop import lr_at, window
from .params import trains

FLAVOR = "official-dspark"


class DraftWeights:
    """The store the reference reads: the target's weights from its own store (frozen), the draft's
    ``mtp.*`` weights as fp32 ``nn.Parameter``s."""

    cache = True

    def __init__(self, base, config, seed: int) -> None:
        self.base = base
        self.specs = {s.full_name: s for s in draft_weights(config)}
        self.tensors = {n: torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(synthetic_values(s, config, seed)))
                                              .float(), requires_grad=trains(s.name)) for n, s in self.specs.items()}

    def get(self, name: str, layer: int | None, device, fp32: bool = False) -> torch.Tensor:
        if layer is None and name in self.tensors:
            return self.tensors[name]
        return self.base.get(name, layer, device, fp32)

    def release(self) -> None:   # the target's weights stay cached: they are read every step
        pass

    def parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        yield from self.tensors.items()


@dataclass
class DraftCurve:
    step: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    held_out_tau: list[tuple[int, float]] = field(default_factory=list)


def target_pass(ds: DSparkReference, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """main_hidden [T, 3D] and the target's greedy next token [T] of a window (no gradient)."""
    with torch.no_grad():
        logits, mh = ds.trunk(ds.model.new_state(ids))
    return mh, torch.argmax(logits, dim=-1)


def draft_rows(ds: DSparkReference, ids: torch.Tensor, mh: torch.Tensor, labels: torch.Tensor, p: int):
    """The draft call anchored at position p (rings: the W positions before p), Markov chain forced
    to the target's tokens: (logits [γ, V], confidence [γ], targets [γ])."""
    W, g = ds.c.sliding_window, ds.gamma
    state = ds.new_state()
    state.pos = max(0, p - W)
    ds.commit(state, mh[state.pos:p])
    tgt = labels[p:p + g]
    d = DSparkReference.draft.__wrapped__(ds, state, int(ids[p]), forced=tgt.tolist())
    return d.logits, d.confidence, tgt


def anchor_positions(T: int, gamma: int, k: int, gen: torch.Generator) -> list[int]:
    return sorted(torch.randperm(T - gamma, generator=gen)[:k].add(1).tolist())


def teacher_forced_tau(ds: DSparkReference, stream: torch.Tensor, s: DraftSettings, bos: int) -> float:
    """Mean over held-out anchors of 1 + the leading rows whose argmax is the target's token."""
    taus = []
    gen = torch.Generator().manual_seed(1234)
    span = max(1, (len(stream) - s.seq_len - 1) // max(1, s.eval_windows))
    with torch.no_grad():
        for j in range(s.eval_windows):
            ids = window(stream, j * span, s.seq_len, bos)
            mh, labels = target_pass(ds, ids)
            for p in anchor_positions(len(ids), ds.gamma, s.anchors, gen):
                logits, _, tgt = draft_rows(ds, ids, mh, labels, p)
                ok = (torch.argmax(logits, -1) == tgt).tolist()
                taus.append(1 + next((i for i, x in enumerate(ok) if not x), len(ok)))
    return sum(taus) / len(taus)


def train_draft(ds: DSparkReference, weights: DraftWeights, train_stream: torch.Tensor, held_stream: torch.Tensor,
                s: DraftSettings, bos: int, state_file: Path, log: Callable[[str], None]) -> DraftCurve:
    params = [p for _, p in weights.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    curve, start = DraftCurve(), 0
    gen = torch.Generator().manual_seed(s.seed)
    if state_file.exists():
        st = torch.load(state_file, weights_only=False)
        with torch.no_grad():
            for name, p in weights.parameters():
                p.copy_(st["weights"][name])
        opt.load_state_dict(st["opt"])
        gen.set_state(st["gen"])
        curve, start = st["curve"], st["step"]
        log(f"resumed from {state_file} at step {start}")
    t0, done = time.time(), 0
    for step in range(start, s.steps):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(s, step)   # same schedule as the trunk's (warmup, cosine to a tenth)
        i = int(torch.randint(0, len(train_stream) - s.seq_len - 1, (1,), generator=gen))
        ids = window(train_stream, i, s.seq_len, bos)
        mh, labels = target_pass(ds, ids)
        losses = []
        for p in anchor_positions(len(ids), ds.gamma, s.anchors, gen):
            logits, conf, tgt = draft_rows(ds, ids, mh, labels, p)
            right = (torch.argmax(logits.detach(), -1) == tgt).float()
            losses.append(F.cross_entropy(logits, tgt)
                          + s.confidence_weight * F.binary_cross_entropy_with_logits(conf, right))
        loss = torch.stack(losses).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, s.clip)
        opt.step()
        curve.step.append(step + 1)
        curve.loss.append(float(loss.detach()))
        done += 1
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            curve.held_out_tau.append((step + 1, teacher_forced_tau(ds, held_stream, s, bos)))
        if (step + 1) % 10 == 0 or step + 1 == s.steps:
            rate = (time.time() - t0) / done
            held = f" held-out τ {curve.held_out_tau[-1][1]:.3f}" if curve.held_out_tau else ""
            log(f"step {step + 1}/{s.steps} loss {sum(curve.loss[-10:]) / len(curve.loss[-10:]):.3f}{held} "
                f"{rate:.2f} s/step ETA {(s.steps - step - 1) * rate / 60:.1f} min")
        if (step + 1) % s.save_every == 0 or step + 1 == s.steps:
            tmp = state_file.with_suffix(".tmp")
            torch.save({"weights": {n: p.detach().clone() for n, p in weights.parameters()}, "opt": opt.state_dict(),
                        "gen": gen.get_state(), "curve": curve, "step": step + 1}, tmp)
            tmp.replace(state_file)
    return curve

