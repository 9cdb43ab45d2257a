"""The DSpark draft's training settings, torch-free so that the CLI's --help imports nothing heavy."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DraftSettings:
    """Training settings (the shipped draft: --steps 900, the rest as here)."""

    steps: int = 600
    seq_len: int = 256
    anchors: int = 24
    lr: float = 2e-3
    warmup: int = 30
    weight_decay: float = 0.1
    clip: float = 1.0
    confidence_weight: float = 0.1
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 4
    save_every: int = 25
