"""An expert bank written group by group into tensors allocated once, instead of stacked at the end.

``weights.stack_bank`` concatenates finished groups, so while a layer loads, every group and the
stack are alive at once: twice the bank on the device (a Pro routed w13 bank is 8.5 GB) and every
group's stored tensors read before the first is converted. ``BankFill`` allocates the bank from the
first group's shapes and copies each group into its slot as it is made, so a load holds the bank and
one group. The result is the tensor ``stack_bank`` makes, element for element (tested).
"""
from __future__ import annotations

from typing import Any

import torch

from .layers.linear import Bf16Weight, Fp4Weight, Fp8Weight, Fp32Weight

Prepared = Fp4Weight | Fp8Weight | Bf16Weight | Fp32Weight


def _parts(w: Prepared) -> dict[str, torch.Tensor | None]:
    if isinstance(w, Fp4Weight):
        return {"packed": w.packed, "scales": w.scales, "global_scale": w.global_scale.reshape(()),
                "input_scale": None if w.input_scale is None else w.input_scale.reshape(())}
    if isinstance(w, Fp8Weight):
        return {"weight": w.weight, "scale": w.scale}
    return {"weight": w.weight}


class BankFill:
    """``groups`` prepared weights of one format and shape -> one bank (``put`` each, then ``done``).

    FP4: rows back to back (packed ``[E*N, K/2]``, scales ``[E*N, K/16]``), global and input scales
    ``[E]`` (no input scales unless every group has one); FP8 / BF16 / FP32: stacked ``[E, ...]``."""

    def __init__(self, first: Prepared, groups: int, name: str = "bank") -> None:
        if groups < 1:
            raise ValueError(f"{name}: expected at least one group, found {groups}")
        self.kind, self.groups, self.name = type(first), groups, name
        parts = _parts(first)
        self.shapes = {k: (None if t is None else (tuple(t.shape), t.dtype)) for k, t in parts.items()}
        self.filled = [False] * groups
        self.bank: dict[str, torch.Tensor | None] = {}
        rows_back_to_back = self.kind is Fp4Weight
        for k, t in parts.items():
            if t is None:
                self.bank[k] = None
            elif rows_back_to_back and t.dim() > 0:
                self.bank[k] = torch.empty((groups * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
            else:
                self.bank[k] = torch.empty((groups, *t.shape), dtype=t.dtype, device=t.device)

    def put(self, i: int, w: Prepared) -> None:
        """Copy group ``i`` into its slot (a clear error on another format, shape or dtype)."""
        if type(w) is not self.kind:
            raise ValueError(f"{self.name} group {i}: expected a {self.kind.__name__} like group 0, "
                             f"found {type(w).__name__}")
        if not 0 <= i < self.groups or self.filled[i]:
            raise ValueError(f"{self.name}: expected an unfilled group index in 0..{self.groups - 1}, found {i}")
        for k, t in _parts(w).items():
            want = self.shapes[k]
            got = None if t is None else (tuple(t.shape), t.dtype)
            if (want is None) != (got is None):
                if k == "input_scale":     # as stack_bank: the bank has input scales only if every group does
                    self.bank[k] = None
                    continue
                raise ValueError(f"{self.name} group {i}: {k} expected {want}, found {got}")
            if got is None:
                continue
            if got != want:
                raise ValueError(f"{self.name} group {i}: {k} expected shape/dtype {want} like group 0, found {got}")
            dst = self.bank[k]
            if dst is None:
                continue
            if self.kind is Fp4Weight and t.dim() > 0:
                dst[i * t.shape[0]:(i + 1) * t.shape[0]].copy_(t)
            else:
                dst[i].copy_(t)
        self.filled[i] = True

    def done(self) -> Prepared:
        missing = [i for i, f in enumerate(self.filled) if not f]
        if missing:
            raise ValueError(f"{self.name}: groups {missing[:8]} never filled")
        b: dict[str, Any] = self.bank
        if self.kind is Fp4Weight:
            return Fp4Weight(b["packed"], b["scales"], b["global_scale"], b["input_scale"])
        if self.kind is Fp8Weight:
            return Fp8Weight(b["weight"], b["scale"])
        return self.kind(b["weight"])


__all__ = ["BankFill"]
