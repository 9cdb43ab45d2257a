"""RMSNorm, and ``NormedInput``: an RMSNorm whose evaluation is deferred to its consumers.

The pre-norms of the block (attn_norm, ffn_norm, spec §3), q_norm (§5 step 1) and the final norm
(§10) feed only linears. A ``NormedInput`` lets an FP4 consumer fuse the norm into its activation
quantization (``ActQuantRequest(rms_weight=...)``: the normalized values are quantized straight from
FP32, never rounded to BF16), while BF16/FP8 consumers take the BF16 normalized tensor, computed
once and shared.
"""
from __future__ import annotations

import torch



def rms_normalize(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * w`` in FP32 (the official RMSNorm computes in FP32), FP32 out."""
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(torch.float32)


class RMSNorm:
    """Weighted RMSNorm over the last dim; BF16 output (the activation dtype)."""
    # activation dtype between steps: BF16; the all-fp32 logic plan sets float32 (dsv4.model)
    act_dtype: torch.dtype = torch.bfloat16

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight.to(torch.float32)
        self.eps = float(eps)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalize(x, self.weight, self.eps).to(self.act_dtype)

    def defer(self, x: torch.Tensor) -> "NormedInput":
        return NormedInput(x, self)


class NormedInput:
    """``norm(x)`` not yet evaluated. ``raw``: the BF16 input ``[M, K]``; ``value()``: BF16 ``norm(raw)``."""

    def __init__(self, raw: torch.Tensor, norm: RMSNorm) -> None:
        self.raw = raw.to(norm.act_dtype).contiguous()
        self.norm = norm
        self._value: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.raw.shape

    @property
    def device(self) -> torch.device:
        return self.raw.device

    def value(self) -> torch.Tensor:
        if self._value is None:
            self._value = self.norm(self.raw)
        return self._value


def materialize(x: "torch.Tensor | NormedInput") -> torch.Tensor:
    """The BF16/FP32 tensor a non-fused consumer reads."""
    return x.value() if isinstance(x, NormedInput) else x


def take_rows(x: "torch.Tensor | NormedInput", index: torch.Tensor) -> "torch.Tensor | NormedInput":
    """Rows of an activation; a deferred norm stays deferred (RMSNorm is row-wise)."""
    if isinstance(x, NormedInput):
        return NormedInput(x.raw[index], x.norm)
    return x[index]
