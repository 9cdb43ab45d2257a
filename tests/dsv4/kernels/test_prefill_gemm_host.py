"""``PrefillGemm``'s host arithmetic on the CPU, its dequantization kernel replaced by the exact torch
decode: alpha applied once after the product, the uninitialised output never read (beta = 0), the
BF16 reduced-precision switch restored. The GPU test runs the real kernel and cuBLAS."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.contract import FP4Operand, GemmRequest
from dsv4.numerics import nvfp4_dequantize, to_float8_e4m3fn

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
from dsv4.kernels.cutedsl.sm90 import prefill_gemm  # noqa: E402


def _op(rows: int, k: int, seed: int) -> FP4Operand:
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=g)
    scales = to_float8_e4m3fn(torch.exp2(torch.rand(rows, k // 16, generator=g) * 6 - 3))
    return FP4Operand(packed, scales, torch.exp2(torch.rand((), generator=g) * 4 - 2).float(), k=k)


def test_host_path_scales_once_and_ignores_the_output_buffer(monkeypatch):
    pg = prefill_gemm.PrefillGemm("cpu")
    monkeypatch.setattr(pg, "dequant", lambda op: nvfp4_dequantize(op.packed, op.scales, 1.0).to(torch.bfloat16))
    warmed = []
    monkeypatch.setattr(pg, "_warm_epilogues", warmed.append)  # the CUDA epilogue kernels: GPU tests
    real_empty = torch.empty  # the output buffer PrefillGemm allocates comes back NaN-filled: beta = 0 must not read it
    monkeypatch.setattr(torch, "empty", lambda *s, **kw: real_empty(*s, **kw).fill_(float("nan")))
    a, b = _op(8, 64, 1), _op(24, 64, 2)
    before = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    got = pg(GemmRequest(a, b))
    assert torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction == before
    assert warmed == [a.packed.device]  # an eager call prepares the capture-safe form for later graphs
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (8, 24) and not got.isnan().any()
    da, db = (nvfp4_dequantize(o.packed, o.scales, 1.0).double() for o in (a, b))
    want = (da @ db.T) * float(a.global_scale * b.global_scale)
    # exact products, FP32 accumulation, one FP32 multiply, one BF16 rounding
    assert torch.allclose(got.double(), want, rtol=2.0 ** -8, atol=0.0)
