"""Grouped linears: E weight matrices ``[N, K]``; rows of ``x`` are grouped back to back, group e owns
rows ``offsets[e]:offsets[e+1]`` (groups may be empty). Used for the routed experts (w13 with a
fused SwiGLU, w2) and for ``wo_a`` (G groups of heads, spec §5 step 7).

FP4 runs one ``grouped_gemm`` request (one activation global scale for all rows, per-group weight
global scales, ``alphas[e] = a.global * b.global[e]``); FP8 / BF16 loop over the non-empty groups.
"""
from __future__ import annotations

from typing import Callable, ClassVar

import torch

from ..kernels.contract import FP4Operand, GroupedGemmRequest
from ..numerics import fp8_act_dequantize, fp8_act_quantize, fp8_block_dequantize
from .dispatch import Dispatcher
from .linear import ACT_SCALE_POLICIES, FP8_ACT_BLOCK, Bf16Weight, Fp4Weight, Fp8Weight, quantize_fp4_input
from .norm import NormedInput, materialize


def group_offsets(counts: torch.Tensor) -> torch.Tensor:
    """Row counts per group ``[E]`` -> int32 offsets ``[E + 1]`` starting at 0."""
    out = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=counts.device)
    out[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return out


class GroupedLinear:
    fmt: ClassVar[str] = ""
    fuses_swiglu: ClassVar[bool] = False

    def __init__(self, name: str, component: str, weight: object, groups: int) -> None:
        self.name = name
        self.component = component
        self.weight = weight
        self.groups = groups

    @property
    def n_per_group(self) -> int:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor, *, swiglu_limit: float | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _no_swiglu(self, swiglu_limit: float | None) -> None:
        if swiglu_limit is not None:
            raise ValueError(f"{self.name}: a fused SwiGLU epilogue needs the fp4 format, found {self.fmt}")

    def _loop(self, x: torch.Tensor, offsets: torch.Tensor, weight_of: Callable[[int], torch.Tensor],
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        out = torch.empty(x.shape[0], self.n_per_group, dtype=out_dtype, device=x.device)
        bounds = offsets.tolist()
        for e in range(self.groups):
            lo, hi = bounds[e], bounds[e + 1]
            if hi > lo:
                out[lo:hi] = (x[lo:hi] @ weight_of(e).T).to(out_dtype)
        return out


class Bf16GroupedLinear(GroupedLinear):
    fmt = "bf16"

    @property
    def n_per_group(self) -> int:
        return int(self.weight.weight.shape[1])

    def __call__(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        w: Bf16Weight = self.weight
        xf = materialize(x).to(torch.bfloat16).to(torch.float32)
        return self._loop(xf, offsets, lambda e: w.weight[e].to(torch.float32))


class Fp32GroupedLinear(GroupedLinear):
    """FP32 in, FP32 weights, FP32 out (plan ``all-fp32``)."""

    fmt = "fp32"

    @property
    def n_per_group(self) -> int:
        return int(self.weight.weight.shape[1])

    def __call__(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        xf = materialize(x).to(torch.float32)
        return self._loop(xf, offsets, lambda e: self.weight.weight[e], torch.float32)


class Fp8GroupedLinear(GroupedLinear):
    fmt = "fp8"

    @property
    def n_per_group(self) -> int:
        return int(self.weight.weight.shape[1])

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_act_dequantize(*fp8_act_quantize(x.to(torch.bfloat16), FP8_ACT_BLOCK))

    def dequantized_weight(self, e: int) -> torch.Tensor:
        w: Fp8Weight = self.weight
        return fp8_block_dequantize(w.weight[e], w.scale[e])

    def __call__(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        return self._loop(self.quantize_input(materialize(x)), offsets, self.dequantized_weight)


class Fp4GroupedLinear(GroupedLinear):
    """``weight``: an ``Fp4Weight`` bank: packed ``[E*N, K/2]``, scales ``[E*N, K/16]``, global ``[E]``,
    input_scale ``[E]`` or None."""

    fmt = "fp4"
    fuses_swiglu = True

    def __init__(self, name: str, component: str, weight: Fp4Weight, groups: int, *, dispatcher: Dispatcher,
                 act_scale: str = "static") -> None:
        if act_scale not in ACT_SCALE_POLICIES:
            raise ValueError(f"act_scale: expected one of {ACT_SCALE_POLICIES}, found {act_scale!r}")
        super().__init__(name, component, weight, groups)
        self.dispatcher = dispatcher
        self.act_scale = act_scale
        self.frozen_scale: torch.Tensor | None = None
        self.weight_operand().validate(f"{name} weight", groups=groups)
        dispatcher.expect(name, component)

    @property
    def n_per_group(self) -> int:
        return self.weight.n // self.groups

    def weight_operand(self) -> FP4Operand:
        w = self.weight
        return FP4Operand(w.packed, w.scales, w.global_scale, k=w.k)

    def activation_global_scale(self) -> torch.Tensor | None:
        """Static: one scale for all groups, the max of the per-group ``input_scale`` (as vLLM reduces
        the per-expert scales of a ModelOpt checkpoint, spec §2.4)."""
        static = None if self.weight.input_scale is None else self.weight.input_scale.amax()
        return {"static": static, "runtime": None, "frozen": self.frozen_scale}[self.act_scale]

    def quantize_input(self, x: torch.Tensor | NormedInput) -> FP4Operand:
        return quantize_fp4_input(self, x)

    def alphas(self, a: FP4Operand) -> torch.Tensor:
        return (a.global_scale * self.weight.global_scale).to(torch.float32)

    def __call__(self, x: torch.Tensor | NormedInput, offsets: torch.Tensor, *, swiglu_limit: float | None = None) -> torch.Tensor:
        a = self.quantize_input(x)
        req = GroupedGemmRequest(a, self.weight_operand(), offsets.to(torch.int32), self.alphas(a), swiglu_limit)
        return self.dispatcher.grouped_gemm(self.name, self.component, req)


GROUPED_CLASSES: dict[str, type[GroupedLinear]] = {"fp4": Fp4GroupedLinear, "fp8": Fp8GroupedLinear,
                                                   "bf16": Bf16GroupedLinear, "fp32": Fp32GroupedLinear}
