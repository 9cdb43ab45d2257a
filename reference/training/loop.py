"""The training loop: AdamW on next-token loss over fixed-length windows of the corpus, the
router's auxiliary-loss-free bias balancing, held-out loss at intervals, and a resumable state file
(a killed run loses at most ``save_every`` steps)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from dsv4 import probes

from .params import TrainableWeights, forward

BALANCE_RATE = 1e-3   # DeepSeek-V3's bias update speed (gamma) for auxiliary-loss-free balancing


@dataclass
class TrainSettings:
    steps: int = 400
    seq_len: int = 512
    lr: float = 2e-3
    warmup: int = 40
    weight_decay: float = 0.1
    clip: float = 1.0
    seed: int = 0
    eval_every: int = 50
    eval_windows: int = 6
    save_every: int = 25


@dataclass
class Curve:
    step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    held_out: list[tuple[int, float]] = field(default_factory=list)


def lr_at(s: TrainSettings, step: int) -> float:
    """Linear warmup, cosine decay to a tenth."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    t = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def window(stream: torch.Tensor, start: int, n: int, bos: int) -> torch.Tensor:
    """[BOS] + n tokens of the stream from ``start``: every window reads like a prompt's start."""
    return torch.cat([torch.tensor([bos]), stream[start:start + n]])


def held_out_loss(model, stream: torch.Tensor, s: TrainSettings, bos: int) -> float:
    span = max(1, (len(stream) - s.seq_len - 1) // max(1, s.eval_windows))
    losses = []
    with torch.no_grad():
        for j in range(s.eval_windows):
            ids = window(stream, j * span, s.seq_len, bos)
            losses.append(float(F.cross_entropy(forward(model, ids)[:-1], ids[1:])))
    return sum(losses) / len(losses)


def balance_bias(weights: TrainableWeights, rec: probes.ProbeRecorder, config) -> None:
    """bias_e += gamma * sign(mean load - load_e) on every score-routed layer (DeepSeek-V3 §2.1.2)."""
    experts = config.n_routed_experts
    with torch.no_grad():
        for name in rec:
            layer = int(name.split(".")[1])
            if config.is_hash_layer(layer):
                continue
            load = torch.bincount(rec[name].reshape(-1), minlength=experts).float()
            bias = weights.get("ffn.gate.bias", layer, "cpu")
            bias += BALANCE_RATE * torch.sign(load.mean() - load)


def optimizer(weights: TrainableWeights, s: TrainSettings) -> torch.optim.Optimizer:
    params = [p for _, p in weights.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=s.lr, betas=(0.9, 0.95), eps=1e-8)


def train(model, weights: TrainableWeights, train_stream: torch.Tensor, held_stream: torch.Tensor,
          s: TrainSettings, bos: int, state_file: Path, log: Callable[[str], None]) -> Curve:
    opt = optimizer(weights, s)
    curve, start = Curve(), 0
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
        for g in opt.param_groups:
            g["lr"] = lr_at(s, step)
        i = int(torch.randint(0, len(train_stream) - s.seq_len - 1, (1,), generator=gen))
        ids = window(train_stream, i, s.seq_len, bos)
        rec = probes.ProbeRecorder(include=r"^layers\.\d+\.ffn\.router\.topk_ids$")
        with rec:
            loss = F.cross_entropy(forward(model, ids)[:-1], ids[1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in weights.parameters() if p.requires_grad], s.clip)
        opt.step()
        balance_bias(weights, rec, model.config)
        curve.step.append(step + 1)
        curve.train_loss.append(float(loss.detach()))
        done += 1
        if (step + 1) % s.eval_every == 0 or step + 1 == s.steps:
            h = held_out_loss(model, held_stream, s, bos)
            curve.held_out.append((step + 1, h))
        if (step + 1) % 10 == 0 or step + 1 == s.steps:
            rate = (time.time() - t0) / done
            recent = curve.train_loss[-10:]
            held = f" held-out {curve.held_out[-1][1]:.3f}" if curve.held_out else ""
            log(f"step {step + 1}/{s.steps} loss {sum(recent) / len(recent):.3f}{held} "
                f"lr {lr_at(s, step):.2e} {s.seq_len / rate:.0f} tok/s ETA {(s.steps - step - 1) * rate / 60:.1f} min")
        if (step + 1) % s.save_every == 0 or step + 1 == s.steps:
            _save(state_file, weights, opt, gen, curve, step + 1)
    return curve


def _save(path: Path, weights: TrainableWeights, opt, gen, curve: Curve, step: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"weights": {n: p.detach().clone() for n, p in weights.parameters()}, "opt": opt.state_dict(),
                "gen": gen.get_state(), "curve": curve, "step": step}, tmp)
    tmp.replace(path)
