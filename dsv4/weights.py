"""Load-time conversion of stored weights to the formats of the precision plan, with a record of
every conversion.

Stored formats (``dsv4.checkpoint.formats``): dense BF16/F32, FP8 E4M3 + UE8M0 128x128 blocks (or
FP32 block scales, Flash-Base), MXFP4 (E2M1 + UE8M0 per 32), NVFP4 (E2M1 + E4M3 per 16 + FP32
global + optional ``input_scale``). Targets: ``fp4`` (NVFP4), ``fp8`` (E4M3 + UE8M0 128x128),
``bf16``. A weight already stored in the target format is used as is; anything else is
dequantized exactly (FP32) and, when the target is quantized, requantized (NVFP4 by the ModelOpt
recipe with a runtime global ``amax/(6*448)``; FP8 by the power-of-two block rule).

Several stored weights can be concatenated along rows (``[w1; w3]`` for a fused SwiGLU), stacked
into a bank (experts), or one weight split into row groups (``wo_a``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from .checkpoint.formats import DENSE, FP8_BLOCK, MXFP4, NVFP4, StoredWeight
from .layers.linear import Bf16Weight, Fp4Weight, Fp8Weight, Fp32Weight
from .numerics import (fp8_block_dequantize, fp8_block_quantize, mxfp4_dequantize, nvfp4_dequantize,
                       nvfp4_quantize)

log = logging.getLogger(__name__)
FP8_BLOCK_ROWS = 128
Prepared = Fp4Weight | Fp8Weight | Bf16Weight | Fp32Weight


def _ue8m0(s: torch.Tensor) -> bool:
    return s.dtype in (torch.uint8, torch.float8_e8m0fnu)


def dequantize(sw: StoredWeight) -> torch.Tensor:
    """Any stored linear -> exact FP32 ``[N, K]`` (spec §2.3, §2.4)."""
    t, kind = sw.tensors, sw.fmt.kind
    if kind == DENSE:
        return t["weight"].to(torch.float32)
    if kind == FP8_BLOCK:
        s = t["scale"]
        if _ue8m0(s):
            return fp8_block_dequantize(t["weight"], s)
        n, k = t["weight"].shape   # Flash-Base: FP32 block scales
        full = s.to(torch.float32).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        return t["weight"].to(torch.float32) * full
    if kind == MXFP4:
        return mxfp4_dequantize(t["weight"], t["scale"])
    if kind == NVFP4:
        return nvfp4_dequantize(t["weight"].view(torch.uint8), t["weight_scale"], t["weight_scale_2"])
    raise ValueError(f"weight {sw.names.get('weight', '?')}: cannot dequantize stored kind {kind!r} as a linear")


def _native(sw: StoredWeight, target: str) -> bool:
    """Stored exactly in the target format (no conversion needed)."""
    if target == "fp4":
        return sw.fmt.kind == NVFP4
    if target == "fp8":
        return sw.fmt.kind == FP8_BLOCK and _ue8m0(sw.tensors["scale"])
    if target == "fp32":
        return False    # always dequantized (exact: every stored format fits in FP32)
    return sw.fmt.kind == DENSE and sw.tensors["weight"].dtype == torch.bfloat16


def _fp4_native(sws: Sequence[StoredWeight]) -> Fp4Weight:
    g = sws[0].tensors["weight_scale_2"].to(torch.float32).reshape(())
    ins = [sw.tensors.get("input_scale") for sw in sws]
    input_scale = None if any(i is None for i in ins) else torch.stack([i.reshape(()) for i in ins]).amax()
    return Fp4Weight(torch.cat([sw.tensors["weight"].view(torch.uint8) for sw in sws]).contiguous(),
                     torch.cat([sw.tensors["weight_scale"] for sw in sws]).contiguous(), g,
                     None if input_scale is None else input_scale.to(torch.float32))


def _fp4_from(w: torch.Tensor) -> Fp4Weight:
    packed, scales, g = nvfp4_quantize(w)
    return Fp4Weight(packed.contiguous(), scales.contiguous(), g.to(torch.float32))


def _fp8_from(w: torch.Tensor) -> Fp8Weight:
    q, s = fp8_block_quantize(w)
    return Fp8Weight(q, s)


def _dequantized_new(w: Prepared) -> torch.Tensor:
    if isinstance(w, Fp4Weight):
        return nvfp4_dequantize(w.packed, w.scales, w.global_scale)
    if isinstance(w, Fp8Weight):
        return fp8_block_dequantize(w.weight, w.scale)
    return w.weight.to(torch.float32)


def convert_rows(sws: Sequence[StoredWeight], target: str) -> tuple[Prepared, str, torch.Tensor | None]:
    """Concatenate stored weights along rows and bring them to ``target``; returns (weight, action, the
    FP32 dequantized source when a conversion happened, else None)."""
    native = all(_native(sw, target) for sw in sws)
    if native and target == "fp4":
        gs = {float(sw.tensors["weight_scale_2"]) for sw in sws}
        if len(gs) == 1:
            return _fp4_native(sws), "as-is", None
        native = False   # one GEMM needs one global scale per matrix: requantize together
    if native and target == "fp8" and all(sw.fmt.shape[0] % FP8_BLOCK_ROWS == 0 for sw in sws[:-1]):
        return (Fp8Weight(torch.cat([sw.tensors["weight"] for sw in sws]).contiguous(),
                          torch.cat([sw.tensors["scale"].view(torch.uint8) for sw in sws]).contiguous()), "as-is", None)
    if native and target == "bf16":
        return Bf16Weight(torch.cat([sw.tensors["weight"] for sw in sws]).contiguous()), "as-is", None
    w = torch.cat([dequantize(sw) for sw in sws])
    out: Prepared = {"fp4": _fp4_from, "fp8": _fp8_from, "bf16": lambda t: Bf16Weight(t.to(torch.bfloat16)),
                     "fp32": lambda t: Fp32Weight(t.to(torch.float32).contiguous())}[target](w)
    action = "dequantize" if target in ("bf16", "fp32") else f"dequantize+quantize-{target}"
    return out, action, w


def stack_bank(ws: Sequence[Prepared]) -> Prepared:
    """Per-group weights (same format, same shape) -> one bank (fp4: rows back to back, globals [E])."""
    w0 = ws[0]
    if isinstance(w0, Fp4Weight):
        ins = [w.input_scale for w in ws]
        return Fp4Weight(torch.cat([w.packed for w in ws]).contiguous(), torch.cat([w.scales for w in ws]).contiguous(),
                         torch.stack([w.global_scale.reshape(()) for w in ws]),
                         None if any(i is None for i in ins) else torch.stack([i.reshape(()) for i in ins]))
    if isinstance(w0, Fp8Weight):
        return Fp8Weight(torch.stack([w.weight for w in ws]), torch.stack([w.scale for w in ws]))
    return type(w0)(torch.stack([w.weight for w in ws]))     # Bf16Weight or Fp32Weight


def split_rows(sw: StoredWeight, groups: int) -> list[StoredWeight]:
    """One stored weight -> ``groups`` row slices (stored format kept when blocks allow, else dense FP32)."""
    n = sw.fmt.shape[0]
    per = n // groups
    out = []
    for g in range(groups):
        lo, hi = g * per, (g + 1) * per
        t, kind = sw.tensors, sw.fmt.kind
        if kind == FP8_BLOCK and per % FP8_BLOCK_ROWS == 0:
            tens = {"weight": t["weight"][lo:hi], "scale": t["scale"][lo // 128:hi // 128]}
        elif kind == NVFP4:
            tens = {**t, "weight": t["weight"][lo:hi], "weight_scale": t["weight_scale"][lo:hi]}
        elif kind == MXFP4:
            tens = {"weight": t["weight"][lo:hi], "scale": t["scale"][lo:hi]}
        elif kind == DENSE:
            tens = {"weight": t["weight"][lo:hi]}
        else:
            tens, kind = {"weight": dequantize(sw)[lo:hi]}, DENSE
        fmt = replace(sw.fmt, kind=kind, shape=(per, sw.fmt.shape[1]))
        out.append(StoredWeight(tens, fmt, dict(sw.names)))
    return out


def to_device(sw: StoredWeight, device: torch.device) -> StoredWeight:
    return StoredWeight({r: t.to(device) for r, t in sw.tensors.items()}, sw.fmt, sw.names)


@dataclass
class ConversionRecord:
    """One prepared weight: where it came from, what it became, and the conversion error."""

    name: str
    component: str
    stored: str
    target: str
    action: str
    count: int = 1
    rel_err: float | None = None   # ||W_new - W_stored|| / ||W_stored|| (None when used as is)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def relative_error(source: torch.Tensor, w: Prepared) -> float:
    """``||W_new - W_stored|| / ||W_stored||`` from the FP32 dequantized source."""
    ref = source.to(torch.float64)
    new = _dequantized_new(w).to(torch.float64).reshape(ref.shape)
    den = float(ref.norm())
    return float((new - ref).norm()) / den if den > 0 else 0.0


def prepare(sws: Sequence[StoredWeight], target: str, *, name: str, component: str,
            records: list[ConversionRecord], device: torch.device) -> Prepared:
    """Convert (rows concatenated) on ``device`` and record it."""
    sws = [to_device(sw, device) for sw in sws]
    w, action, source = convert_rows(sws, target)
    err = None if source is None else relative_error(source, w)
    stored = ", ".join(sorted({sw.fmt.describe() for sw in sws}))
    records.append(ConversionRecord(name, component, stored, target, action, 1, err))
    return w


def prepare_bank(groups: Sequence[Sequence[StoredWeight] | Callable[[], Sequence[StoredWeight]]], target: str, *,
                 name: str, component: str, records: list[ConversionRecord], device: torch.device) -> Prepared:
    """One prepared weight per group, each written into the bank as it is made (``bank_fill.BankFill``:
    the bank and one group alive, not every group and their stack); a group given as a callable is
    read only when its turn comes. A single aggregated record (max error over groups)."""
    from .bank_fill import BankFill

    local: list[ConversionRecord] = []
    fill: BankFill | None = None
    for i, g in enumerate(groups):
        w = prepare(g() if callable(g) else g, target, name=name, component=component, records=local, device=device)
        if fill is None:
            fill = BankFill(w, len(groups), name)
        fill.put(i, w)
        del w
    if fill is None:
        raise ValueError(f"{name}: expected at least one group, found none")
    bank = fill.done()
    errs = [r.rel_err for r in local if r.rel_err is not None]
    records.append(ConversionRecord(name, component, ", ".join(sorted({r.stored for r in local})), target,
                                    ", ".join(sorted({r.action for r in local})), len(local),
                                    max(errs) if errs else None))
    return bank
