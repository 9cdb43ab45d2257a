"""Float64 reference of the NVFP4 GEMM: the number every kernel's output is judged against."""
from __future__ import annotations

import torch

from ._checks import as_scalar_f32, fail
from .nvfp4 import nvfp4_dequantize


def nvfp4_gemm_reference(a_packed: torch.Tensor, a_scales: torch.Tensor, a_global: torch.Tensor | float,
                         b_packed: torch.Tensor, b_scales: torch.Tensor, b_global: torch.Tensor | float, *,
                         a_scale_layout: str = "linear", b_scale_layout: str = "linear") -> torch.Tensor:
    """``y[M, N] = (a_g * b_g) * sum_k A[m, k] * B[n, k]`` in float64, ``A = e2m1 * e4m3`` (exact).

    ``a_packed [M, K/2]``, ``b_packed [N, K/2]`` (uint8, K-major), scales ``float8_e4m3fn`` in the
    given layouts (see :func:`nvfp4_dequantize`). The block-dequantized operands are exact, every
    product is exact in float64, and the global scales are applied after the product (never folded
    into the operands, spec nvfp4-and-kernels.md §6).
    """
    if a_packed.dim() != 2 or b_packed.dim() != 2:
        fail("nvfp4_gemm_reference operands", "2-D a [M, K/2] and b [N, K/2]",
             f"a {list(a_packed.shape)}, b {list(b_packed.shape)}")
    if a_packed.shape[1] != b_packed.shape[1]:
        fail("nvfp4_gemm_reference K/2", f"equal for a and b ({a_packed.shape[1]})", b_packed.shape[1])
    a = nvfp4_dequantize(a_packed, a_scales, 1.0, scale_layout=a_scale_layout).to(torch.float64)
    b = nvfp4_dequantize(b_packed, b_scales, 1.0, scale_layout=b_scale_layout).to(torch.float64)
    ga = as_scalar_f32(a_global, "nvfp4_gemm_reference a_global", a.device).to(torch.float64)
    gb = as_scalar_f32(b_global, "nvfp4_gemm_reference b_global", a.device).to(torch.float64)
    return (a @ b.T) * (ga * gb)
