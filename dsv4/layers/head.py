"""Final head (spec §10): hc_head collapse of the n streams, final RMSNorm, LM head -> FP32 logits.

The LM head is a ``Linear`` of the plan's ``lm_head`` format with FP32 output; an FP4 head fuses the
final norm into its activation quantization.
"""
from __future__ import annotations

import torch

from .. import probes
from .linear import Linear
from .mhc import HCHead
from .norm import RMSNorm


class Head:
    def __init__(self, hc_head: HCHead, norm: RMSNorm, lm_head: Linear) -> None:
        self.hc_head, self.norm, self.lm_head = hc_head, norm, lm_head

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        yn = self.norm.defer(y)
        if probes.active():
            probes.emit("final_norm", yn.value())
        return self.lm_head(yn).to(torch.float32)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        y = self.hc_head(X)
        probes.emit("hc_head", y)
        logits = self.logits(y)
        probes.emit("logits", logits)
        return logits
