"""Kernel faults injected around a real kernel backend (``cutedsl_sm90`` on an H100, a user's kernel):
the kernel itself runs unchanged; the fault alters what it is given (a weight's scale bytes, the
activation codes of a K tail, a grouped GEMM's per-expert global scales) or what it returns (a row of
the output, an activation block scale). The model's dispatcher still records the request the model
made, so the audit replays the call the model asked for and sees what the faulty kernel returned.

Each built-in kernel fault of the zoo has its stand-in (a copy of ``emulated`` with one piece replaced,
:mod:`parity.bugzoo.backends`) for devices without a kernel backend, and its ``Around`` form here for
devices with one; :func:`parity.bugzoo.backends.swap_backend` picks.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest

Bytes = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Around:
    """What a fault changes around a kernel call; every piece is optional (None: untouched).

    ``weight_scale_bytes``: the weight operand's scale bytes as the kernel reads them (any layout);
    ``a_code_tail``: K index from which the activation codes the kernel reads are zeroed (a dropped
    k-tail), given K; ``output_rows``: what is left of a fused-SwiGLU grouped output; ``act_scale_bytes``:
    the scale bytes the activation quantizer returns; ``expert_shift``: a grouped GEMM given expert
    ``e + shift``'s global scale for expert e."""

    weight_scale_bytes: Bytes | None = None
    a_code_tail: Callable[[int], int | None] | None = None
    output_rows: Callable[[torch.Tensor], torch.Tensor] | None = None
    act_scale_bytes: Bytes | None = None
    expert_shift: int = 0

    def wrap(self, inner: Any) -> "FaultAround":
        return FaultAround(inner, self)


def _with_scale_bytes(op: FP4Operand, f: Bytes) -> FP4Operand:
    s = f(op.scales.view(torch.uint8)).contiguous().view(torch.float8_e4m3fn)
    return FP4Operand(op.packed, s, op.global_scale, k=op.k, scale_layout=op.scale_layout)


def _with_code_tail(op: FP4Operand, start: int | None) -> FP4Operand:
    if start is None or start >= op.k:
        return op
    packed = op.packed.clone()
    packed[:, start // 2:] = 0            # code 0 is +0: the tail contributes nothing
    return FP4Operand(packed, op.scales, op.global_scale, k=op.k, scale_layout=op.scale_layout)


class FaultAround:
    """``inner`` with one fault around its calls. Keeps ``inner``'s name, so the model's kernel log
    still shows every planned module reaching the backend it was loaded on."""

    def __init__(self, inner: Any, around: Around) -> None:
        self.inner, self.around = inner, around
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:      # anything else a backend offers (device, prepare_*, ...)
        return getattr(self.inner, attr)

    def _operands(self, req: Any) -> Any:
        f = self.around
        if f.weight_scale_bytes is not None:
            req = replace(req, b=_with_scale_bytes(req.b, f.weight_scale_bytes))
        if f.a_code_tail is not None:
            req = replace(req, a=_with_code_tail(req.a, f.a_code_tail(req.a.k)))
        return req

    def gemm(self, req: GemmRequest, **kw: Any) -> torch.Tensor:
        return self.inner.gemm(self._operands(req), **kw)

    def weight_routes(self) -> list[tuple[str, Callable[[GemmRequest], torch.Tensor]]]:
        """The inner backend's routes (``parity.audit.weights``), each with the fault around it: forwarded
        bare by ``__getattr__``, they would let the weight audit read past the fault."""
        from ..audit.weights import dense_routes

        return [(label, lambda req, g=g: g(self._operands(req))) for label, g in dense_routes(self.inner)]

    def grouped_gemm(self, req: GroupedGemmRequest, **kw: Any) -> torch.Tensor:
        f = self.around
        r = self._operands(req)
        if f.expert_shift:
            g = torch.roll(r.b.global_scale, -f.expert_shift)   # expert e gets expert e+shift's scale
            b = FP4Operand(r.b.packed, r.b.scales, g, k=r.b.k, scale_layout=r.b.scale_layout)
            r = replace(r, b=b, alphas=r.a.global_scale * g)
        y = self.inner.grouped_gemm(r, **kw)
        return f.output_rows(y) if f.output_rows is not None and req.swiglu_limit is not None else y

    def quantize_activation(self, req: ActQuantRequest, **kw: Any) -> FP4Operand:
        op = self.inner.quantize_activation(req, **kw)
        f = self.around
        return _with_scale_bytes(op, f.act_scale_bytes) if f.act_scale_bytes is not None else op
