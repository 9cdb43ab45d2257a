"""Operands, float64 dequantization and the result log shared by the sm_90a GPU kernel tests
(test_cutedsl_sm90.py, test_sm90_decode_gemm_gpu.py); imported by path (pytest runs in importlib mode)."""
from __future__ import annotations

import json
import os

import torch

from dsv4.kernels.contract import FP4Operand
from dsv4.numerics import e2m1_decode, e4m3_decode, swizzle_scales, to_float8_e4m3fn, unpack_nibbles


def _report(kind: str, **fields) -> None:
    path = os.environ.get("DSV4_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")


def _operand(rows: int, k: int, gen: torch.Generator, *, layout: str = "linear", groups: int | None = None,
             zero_scale_frac: float = 0.05) -> FP4Operand:
    """Uniform random codes (all 16, -0 included) and E4M3 block scales spanning 2^-4 .. 2^4."""
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    mag = torch.exp2(torch.rand(rows, k // 16, generator=gen) * 8 - 4)
    mag[torch.rand(rows, k // 16, generator=gen) < zero_scale_frac] = 0.0
    scales = to_float8_e4m3fn(mag)
    if layout == "swizzled":
        per = rows // (groups or 1)
        scales = swizzle_scales(scales.view(torch.uint8).reshape(groups or 1, per, k // 16)).reshape(-1)
        scales = scales.view(torch.float8_e4m3fn)
    g = (torch.exp2(torch.rand(groups, generator=gen) * 4 - 2) if groups
         else torch.exp2(torch.rand((), generator=gen) * 4 - 2))
    return FP4Operand(packed.cuda(), scales.cuda(), g.float().cuda(), k=k, scale_layout=layout)


def _deq(op: FP4Operand, rows: slice | None = None, group: int | None = None, groups: int = 1) -> torch.Tensor:
    """Block-dequantized operand (no global scale) in float64, linear scales."""
    from dsv4.numerics import unswizzle_scales

    n = op.rows // groups
    sc = op.k // 16
    if group is not None:
        packed = op.packed[group * n:(group + 1) * n]
        if op.scale_layout == "swizzled":
            per = op.scales.numel() // groups
            scales = unswizzle_scales(op.scales[group * per:(group + 1) * per], n, sc)
        else:
            scales = op.scales[group * n:(group + 1) * n]
    else:
        packed = op.packed
        scales = op.scales if op.scale_layout == "linear" else unswizzle_scales(op.scales, op.rows, sc)
    vals = e2m1_decode(unpack_nibbles(packed)).double().reshape(packed.shape[0], sc, 16)
    return (vals * e4m3_decode(scales).double().unsqueeze(-1)).reshape(packed.shape[0], op.k)


def _ulp_bf16(x: torch.Tensor) -> torch.Tensor:
    e = torch.floor(torch.log2(x.abs().clamp(min=2.0 ** -126)))
    return torch.exp2(e - 7)
