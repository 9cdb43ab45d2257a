"""Format descriptors for stored weights, and their validation against the logical shape.

A stored weight is a set of tensors (by role) plus a ``WeightFormat``. Roles: ``weight`` (the main
tensor), ``scale`` (UE8M0 block scales of FP8-block / MXFP4 weights; FP32 for the Flash-Base
layout and the compressed-tensors writer), ``weight_scale`` (NVFP4 E4M3 per 16), ``weight_scale_2``
(NVFP4 FP32 global), ``input_scale`` (NVFP4 static activation scale). Dequantization is NOT here: the reference and the
native side each implement it, on purpose (docs/design.md principle 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from .errors import CheckpointError
from .names import INDEX, LINEAR, NORM, PARAM, TABLE, WeightSpec

DENSE, FP8_BLOCK, MXFP4, NVFP4, RAW, HASH = "dense", "fp8_block", "mxfp4", "nvfp4", "param", "index"
FLOAT_DTYPES = ("BF16", "F16", "F32")
UE8M0_DTYPES = ("F8_E8M0", "U8")


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor, from the safetensors header (nothing loaded)."""

    name: str
    dtype: str                # safetensors dtype string, e.g. "BF16", "F8_E4M3"
    shape: tuple[int, ...]
    shard: str


@dataclass(frozen=True)
class WeightFormat:
    kind: str                              # dense | fp8_block | mxfp4 | nvfp4 | param | index
    shape: tuple[int, ...]                 # logical shape ([out, in] for linears)
    dtype: str                             # stored dtype of the main tensor
    block: tuple[int, int] | None = None   # scale block (rows, cols): (128,128), (1,32), (1,16)
    scale_dtype: str | None = None
    scale_layout: str = "linear"

    def describe(self) -> str:
        if self.kind in (DENSE, RAW, HASH):
            return f"{self.kind}[{self.dtype}]"
        return f"{self.kind}[{self.dtype}, scale {self.scale_dtype} per {self.block[0]}x{self.block[1]}]"


@dataclass
class StoredWeight:
    """Stored tensors of one canonical weight (as stored: no dequantization) and their format."""

    tensors: dict[str, torch.Tensor]
    fmt: WeightFormat
    names: dict[str, str] = field(default_factory=dict)   # role -> stored tensor name


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _err(spec: WeightSpec, stored: str, what: str, expected: Any, found: Any) -> CheckpointError:
    return CheckpointError(f"tensor '{stored}' (weight {spec.full_name}): {what}: expected {expected}, "
                           f"found {found}")


def _expect_scalar(spec: WeightSpec, t: TensorInfo) -> None:
    if t.dtype != "F32" or t.shape not in ((), (1,)):
        raise _err(spec, t.name, "dtype/shape", "F32 scalar (shape [] or [1])", f"{t.dtype} {list(t.shape)}")


def infer_format(spec: WeightSpec, roles: Mapping[str, TensorInfo]) -> WeightFormat:
    """Decide and validate the stored format of one weight from its tensors' dtypes and shapes."""
    w = roles.get("weight")
    if w is None:
        raise CheckpointError(f"weight {spec.full_name}: missing its main tensor (expected role 'weight'); "
                              f"found roles {sorted(roles)}")
    shape = spec.shape
    if spec.kind in (NORM, TABLE, PARAM):
        want = ("F32",) if spec.kind == PARAM else FLOAT_DTYPES
        if spec.kind == PARAM and w.dtype in FLOAT_DTYPES:
            want = FLOAT_DTYPES   # transformers writes fp32 parameters in the model dtype
        if w.dtype not in want:
            raise _err(spec, w.name, "dtype", " or ".join(want), w.dtype)
        found = w.shape if w.shape != () else (1,)
        if found != shape:
            raise _err(spec, w.name, "shape", list(shape), list(w.shape))
        _no_extra(spec, roles, {"weight"})
        return WeightFormat(RAW if spec.kind == PARAM else DENSE, shape, w.dtype)
    if spec.kind == INDEX:
        if w.dtype not in ("I64", "I32"):
            raise _err(spec, w.name, "dtype", "I64 or I32", w.dtype)
        if w.shape != shape:
            raise _err(spec, w.name, "shape", list(shape), list(w.shape))
        _no_extra(spec, roles, {"weight"})
        return WeightFormat(HASH, shape, w.dtype)
    assert spec.kind == LINEAR
    N, K = shape
    if "weight_scale" in roles or "weight_scale_2" in roles:   # NVFP4 (ModelOpt)
        for r in ("weight_scale", "weight_scale_2"):
            if r not in roles:
                raise CheckpointError(f"weight {spec.full_name}: NVFP4 needs '{r}' beside weight_scale; "
                                      f"found roles {sorted(roles)}")
        if w.dtype not in ("U8", "I8"):
            raise _err(spec, w.name, "dtype", "U8 (packed E2M1 pairs)", w.dtype)
        if K % 16:
            raise _err(spec, w.name, "logical in-features", "a multiple of 16 for NVFP4", K)
        if w.shape != (N, K // 2):
            raise _err(spec, w.name, "shape", f"[{N}, {K // 2}] (logical [{N}, {K}], 2 per byte)", list(w.shape))
        s = roles["weight_scale"]
        if s.dtype != "F8_E4M3":
            raise _err(spec, s.name, "dtype", "F8_E4M3", s.dtype)
        if s.shape != (N, K // 16):
            raise _err(spec, s.name, "shape (one E4M3 scale per 16 inputs)", [N, K // 16], list(s.shape))
        _expect_scalar(spec, roles["weight_scale_2"])
        if "input_scale" in roles:
            _expect_scalar(spec, roles["input_scale"])
        _no_extra(spec, roles, {"weight", "weight_scale", "weight_scale_2", "input_scale"})
        return WeightFormat(NVFP4, shape, w.dtype, (1, 16), "F8_E4M3")
    if w.dtype in ("I8", "U8"):                                  # MXFP4 (official experts)
        if "scale" not in roles:
            raise CheckpointError(f"weight {spec.full_name}: packed FP4 weight '{w.name}' needs a '.scale' "
                                  f"sibling (UE8M0 per 32); found roles {sorted(roles)}")
        if K % 32:
            raise _err(spec, w.name, "logical in-features", "a multiple of 32 for MXFP4", K)
        if w.shape != (N, K // 2):
            raise _err(spec, w.name, "shape", f"[{N}, {K // 2}] (logical [{N}, {K}], 2 per byte)", list(w.shape))
        s = roles["scale"]
        if s.dtype not in UE8M0_DTYPES:
            raise _err(spec, s.name, "dtype", "F8_E8M0 (or U8 bytes)", s.dtype)
        if s.shape != (N, K // 32):
            raise _err(spec, s.name, "shape (one UE8M0 scale per 32 inputs)", [N, K // 32], list(s.shape))
        _no_extra(spec, roles, {"weight", "scale"})
        return WeightFormat(MXFP4, shape, w.dtype, (1, 32), s.dtype)
    if w.dtype == "F8_E4M3":                                     # FP8 128x128 blocks
        if "scale" not in roles:
            raise CheckpointError(f"weight {spec.full_name}: FP8 weight '{w.name}' needs a block-scale sibling "
                                  f"('.scale' or '.weight_scale_inv'); found roles {sorted(roles)}")
        if w.shape != (N, K):
            raise _err(spec, w.name, "shape", [N, K], list(w.shape))
        s = roles["scale"]
        if s.dtype not in UE8M0_DTYPES + ("F32",):
            raise _err(spec, s.name, "dtype", "F8_E8M0 / U8 (UE8M0) or F32 (Flash-Base, compressed-tensors)",
                       s.dtype)
        want = (ceil_div(N, 128), ceil_div(K, 128))
        if s.shape != want:
            raise _err(spec, s.name, "shape (one scale per 128x128 block)", list(want), list(s.shape))
        _no_extra(spec, roles, {"weight", "scale"})
        return WeightFormat(FP8_BLOCK, shape, w.dtype, (128, 128), s.dtype)
    if w.dtype in FLOAT_DTYPES:
        if w.shape != (N, K):
            raise _err(spec, w.name, "shape", [N, K], list(w.shape))
        _no_extra(spec, roles, {"weight"})
        return WeightFormat(DENSE, shape, w.dtype)
    raise _err(spec, w.name, "dtype", "BF16/F16/F32, F8_E4M3 (+scale), I8/U8 packed FP4 (+scales)", w.dtype)


def _no_extra(spec: WeightSpec, roles: Mapping[str, TensorInfo], allowed: set[str]) -> None:
    extra = sorted(set(roles) - allowed)
    if extra:
        names = [roles[r].name for r in extra]
        raise CheckpointError(f"weight {spec.full_name}: unexpected tensors {names} for its format "
                              f"(allowed roles: {sorted(allowed)})")


def stored_shapes(kind: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Stored tensor shapes per role of a weight of logical ``shape`` in format ``kind`` (no allocation;
    used for dry-run memory estimates and to enumerate real checkpoints' expected tensors)."""
    if kind in (DENSE, RAW, HASH):
        return {"weight": tuple(shape)}
    n, k = shape
    if kind == FP8_BLOCK:
        return {"weight": (n, k), "scale": (ceil_div(n, 128), ceil_div(k, 128))}
    if kind == MXFP4:
        return {"weight": (n, k // 2), "scale": (n, k // 32)}
    if kind == NVFP4:
        return {"weight": (n, k // 2), "weight_scale": (n, k // 16), "weight_scale_2": (), "input_scale": ()}
    raise CheckpointError(f"format kind: expected one of {[DENSE, FP8_BLOCK, MXFP4, NVFP4, RAW, HASH]}, "
                          f"found {kind!r}")
