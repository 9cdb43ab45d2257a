"""Quantized linears ``y = x W^T``, one class per plan format (dsv4.plan): the format is chosen when
the model is built, never by an ``if`` inside a forward.

* ``Fp4Linear``  : NVFP4 W4A4 through the backend (``quantize_activation`` + ``gemm``), FP32 global
                   scales in the epilogue; optional fused SwiGLU epilogue (contract GemmRequest).
* ``Fp8Linear``  : the official FP8 recipe (spec §2.3, §12): E4M3 weight with UE8M0 128x128 blocks,
                   activations per token per 128 in E4M3 with UE8M0 scales; the product of two E4M3
                   values and the power-of-two scales are exact in FP32, so dequantize-then-FP32-matmul
                   is the FP8 GEMM up to FP32 summation order.
* ``Bf16Linear`` : BF16 weight and BF16 activation, FP32 accumulation.

Each numerically meaningful step is a small method (``weight_operand``, ``quantize_input``,
``activation_global_scale``, ``dequantized_weight``) so a fault can be injected into one instance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..kernels.contract import ActQuantRequest, FP4Operand, GemmRequest
from ..numerics import fp8_act_dequantize, fp8_act_quantize, fp8_block_dequantize
from .dispatch import Dispatcher
from .norm import NormedInput, materialize

ACT_SCALE_POLICIES = ("static", "runtime", "frozen")
FP8_ACT_BLOCK = 128


@dataclass
class Fp4Weight:
    """NVFP4 weight ``[N, K]``: packed uint8 ``[N, K/2]``, E4M3 scales ``[N, K/16]`` (linear layout), FP32
    dequantization global scale (0-d; ``[E]`` for a bank), static activation scale or None."""

    packed: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    @property
    def k(self) -> int:
        return 2 * int(self.packed.shape[-1])

    @property
    def n(self) -> int:
        return int(self.packed.shape[0])


class _UnpackedShape:
    """``n``/``k`` of a weight stored one element per value (``[N, K]`` or a bank ``[E, N, K]``)."""

    weight: torch.Tensor

    @property
    def k(self) -> int:
        return int(self.weight.shape[-1])

    @property
    def n(self) -> int:
        return int(self.weight.shape[-2])


@dataclass
class Fp8Weight(_UnpackedShape):
    """E4M3 weight ``[N, K]`` (``[E, N, K]`` for a bank) and UE8M0 uint8 scales per 128x128 block."""

    weight: torch.Tensor
    scale: torch.Tensor


@dataclass
class Bf16Weight(_UnpackedShape):
    """BF16 weight ``[N, K]`` (``[E, N, K]`` for a bank)."""

    weight: torch.Tensor


@dataclass
class Fp32Weight(_UnpackedShape):
    """FP32 weight ``[N, K]`` (``[E, N, K]`` for a bank): every stored format dequantizes exactly into it."""

    weight: torch.Tensor


def quantize_fp4_input(layer: "Fp4Linear | object", x: torch.Tensor | NormedInput) -> FP4Operand:
    """BF16 -> NVFP4 through ``layer``'s backend with its activation global scale; a deferred
    RMSNorm is fused into the quantization; under ``act_scale="frozen"`` the first scale is kept.
    Shared by the dense and grouped FP4 linears (their ``quantize_input`` stays the patch point)."""
    g = layer.activation_global_scale()
    if isinstance(x, NormedInput):
        req = ActQuantRequest(x.raw, g, rms_weight=x.norm.weight, rms_eps=x.norm.eps)
    else:
        req = ActQuantRequest(x.to(torch.bfloat16).contiguous(), g)
    a = layer.dispatcher.quantize_activation(layer.name, layer.component, req)
    if layer.act_scale == "frozen" and layer.frozen_scale is None:
        layer.frozen_scale = a.global_scale.detach().clone()
    return a


class Linear:
    """Base: ``name`` (module path, e.g. ``layers.2.attn.wq_a``), ``component`` (plan class)."""

    fmt: ClassVar[str] = ""
    fuses_swiglu: ClassVar[bool] = False   # True when the GEMM can apply the SwiGLU epilogue itself

    def __init__(self, name: str, component: str, weight: object, *, out_dtype: torch.dtype = torch.bfloat16):
        self.name = name
        self.component = component
        self.weight = weight
        self.out_dtype = out_dtype

    @property
    def in_features(self) -> int:
        return self.weight.k  # type: ignore[attr-defined]

    @property
    def out_features(self) -> int:
        return self.weight.n  # type: ignore[attr-defined]

    def __call__(self, x: torch.Tensor | NormedInput, *, swiglu_limit: float | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _no_swiglu(self, swiglu_limit: float | None) -> None:
        if swiglu_limit is not None:
            raise ValueError(f"{self.name}: a fused SwiGLU epilogue needs the fp4 format, found {self.fmt}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.component}, [{self.out_features}, {self.in_features}])"


class Bf16Linear(Linear):
    fmt = "bf16"

    def __call__(self, x: torch.Tensor | NormedInput, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        xb = materialize(x).to(torch.bfloat16)
        return (xb.to(torch.float32) @ self.weight.weight.to(torch.float32).T).to(self.out_dtype)


class Fp32Linear(Linear):
    """FP32 weight, FP32 activation, FP32 output: the logic column's native side (plan ``all-fp32``)."""

    fmt = "fp32"

    def __call__(self, x: torch.Tensor | NormedInput, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        return materialize(x).to(torch.float32) @ self.weight.weight.T


class Fp8Linear(Linear):
    fmt = "fp8"

    def __init__(self, name: str, component: str, weight: Fp8Weight, *, out_dtype: torch.dtype = torch.bfloat16):
        if weight.k % FP8_ACT_BLOCK:
            raise ValueError(f"{name}: fp8 format: expected in-features a multiple of {FP8_ACT_BLOCK} "
                             f"(activation blocks), found {weight.k}")
        super().__init__(name, component, weight, out_dtype=out_dtype)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """Per token per 128: E4M3 with UE8M0 power-of-two scales, returned dequantized (exact) in FP32."""
        return fp8_act_dequantize(*fp8_act_quantize(x.to(torch.bfloat16), FP8_ACT_BLOCK))

    def dequantized_weight(self) -> torch.Tensor:
        return fp8_block_dequantize(self.weight.weight, self.weight.scale)

    def __call__(self, x: torch.Tensor | NormedInput, *, swiglu_limit: float | None = None) -> torch.Tensor:
        self._no_swiglu(swiglu_limit)
        xq = self.quantize_input(materialize(x))
        return (xq @ self.dequantized_weight().T).to(self.out_dtype)


class Fp4Linear(Linear):
    fmt = "fp4"
    fuses_swiglu = True

    def __init__(self, name: str, component: str, weight: Fp4Weight, *, dispatcher: Dispatcher,
                 act_scale: str = "static", out_dtype: torch.dtype = torch.bfloat16):
        if act_scale not in ACT_SCALE_POLICIES:
            raise ValueError(f"act_scale: expected one of {ACT_SCALE_POLICIES}, found {act_scale!r}")
        super().__init__(name, component, weight, out_dtype=out_dtype)
        self.dispatcher = dispatcher
        self.act_scale = act_scale
        self.frozen_scale: torch.Tensor | None = None
        self.weight_operand().validate(f"{name} weight")   # contract violations surface at load
        dispatcher.expect(name, component)

    def weight_operand(self) -> FP4Operand:
        w = self.weight
        return FP4Operand(w.packed, w.scales, w.global_scale, k=w.k)

    def activation_global_scale(self) -> torch.Tensor | None:
        """The static dequantization scale for the activation, or None for the runtime amax."""
        return {"static": self.weight.input_scale, "runtime": None, "frozen": self.frozen_scale}[self.act_scale]

    def quantize_input(self, x: torch.Tensor | NormedInput) -> FP4Operand:
        return quantize_fp4_input(self, x)

    def __call__(self, x: torch.Tensor | NormedInput, *, swiglu_limit: float | None = None) -> torch.Tensor:
        a = self.quantize_input(x)
        y = self.dispatcher.gemm(self.name, self.component, GemmRequest(a, self.weight_operand(), swiglu_limit))
        return y.to(self.out_dtype)


LINEAR_CLASSES: dict[str, type[Linear]] = {"fp4": Fp4Linear, "fp8": Fp8Linear, "bf16": Bf16Linear,
                                           "fp32": Fp32Linear}
