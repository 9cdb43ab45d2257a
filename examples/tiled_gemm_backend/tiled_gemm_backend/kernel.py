"""The "kernel": NVFP4 GEMMs the way a tiled kernel computes them, in torch so it runs anywhere.

Written from the contract (``dsv4.kernels.contract``), not from the emulated backend: its own E2M1
table and nibble order, its own E4M3 scale expansion, FP32 partial sums over K tiles of 64 (the
order a K loop produces, not one matmul), ``alpha`` after the sum, the clamped-gate SwiGLU epilogue,
a BF16 cast. Activation quantization is delegated to the project's emulated backend: a package
may implement only the calls it owns.

``TILED_GEMM_BUG=ktail`` drops the last K tile of every GEMM whose K is not a multiple of 256 — a
classic tail bug — so the docs can show a failing audit.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dsv4.kernels.contract import (ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest,
                                   KernelContractError)

BUG_ENV = "TILED_GEMM_BUG"
K_TILE = 64
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _decode(op: FP4Operand, rows: slice | None = None) -> torch.Tensor:
    """FP32 ``e2m1 * e4m3`` of (some rows of) a linear-layout operand, global scale not applied."""
    if op.scale_layout != "linear":
        raise KernelContractError(f"tiled_gemm: scale_layout: expected 'linear', found {op.scale_layout!r}")
    packed = op.packed if rows is None else op.packed[rows]
    scales = op.scales if rows is None else op.scales[rows]
    lut = torch.tensor(_E2M1, dtype=torch.float32, device=packed.device)
    lo, hi = (packed & 0x0F).long(), (packed >> 4).long()      # element 2k: low nibble
    codes = torch.stack((lut[lo], lut[hi]), dim=-1).reshape(packed.shape[0], -1)
    return codes * scales.to(torch.float32).repeat_interleave(16, dim=1)


def _epilogue(y: torch.Tensor, swiglu_limit: float | None) -> torch.Tensor:
    if swiglu_limit is None:
        return y.to(torch.bfloat16)
    n = y.shape[-1] // 2
    gate = y[..., :n].clamp(max=swiglu_limit)                  # the sigmoid reads the clamped gate
    up = y[..., n:].clamp(min=-swiglu_limit, max=swiglu_limit)
    return (F.silu(gate) * up).to(torch.bfloat16)


class TiledGemmBackend:
    name = "tiled_gemm"

    def __init__(self, bug: str = "") -> None:
        if bug not in ("", "ktail"):
            raise ValueError(f"{BUG_ENV}: expected '' or 'ktail', found {bug!r}")
        self.bug = bug
        from dsv4.kernels.emulated import EmulatedBackend

        self._quantizer = EmulatedBackend()

    def _tiled(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k = a.shape[1]
        tiles = list(range(0, k, K_TILE))
        if self.bug == "ktail" and k % 256:
            tiles = tiles[:-1]
        acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
        for t in tiles:
            acc += a[:, t:t + K_TILE] @ b[:, t:t + K_TILE].T
        return acc

    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()   # the contract's own checks, before any work
        acc = self._tiled(_decode(req.a), _decode(req.b))
        return _epilogue(acc * (req.a.global_scale * req.b.global_scale), req.swiglu_limit)

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor:
        req.validate(check_values=check_values)
        n = req.n_per_expert
        a = _decode(req.a)
        offsets = req.offsets.to("cpu").tolist()
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=req.a.device)
        for e in range(req.num_experts):
            lo, hi = offsets[e], offsets[e + 1]
            if lo == hi:
                continue
            b = _decode(req.b, slice(e * n, (e + 1) * n))
            out[lo:hi] = _epilogue(self._tiled(a[lo:hi], b) * req.alphas[e], req.swiglu_limit)
        return out

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        return self._quantizer.quantize_activation(req, check_values=check_values)
