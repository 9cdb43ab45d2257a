"""FP8 E4M3 with UE8M0 power-of-two scales: 128x128 weight blocks and per-token activation blocks.

Weights (spec dsv4-architecture.md §2.3): ``W[o, i] = float(W8[o, i]) * 2^(S[o//128, i//128] - 127)``.
Activations (spec §12, official ``act_quant`` with ``scale_fmt`` set): per token per ``block``
elements, ``s = 2^ceil(log2(max(amax, 1e-4) * fl32(1/448)))``, ``q = E4M3_RNE(clamp(x/s, -448, 448))``.
Division by a power of two is exact, so only the E4M3 rounding is lossy.
"""
from __future__ import annotations

import torch

from ._checks import as_bytes, check_dtype, check_float, check_last_dim_multiple, check_shape, fail
from .e4m3 import E4M3_MAX, e4m3_decode, pow2_f32, to_float8_e4m3fn
from .ue8m0 import UE8M0_BIAS, UE8M0_NAN_BYTE, pow2_ceil_exponent, ue8m0_decode

FP8_WEIGHT_BLOCK = 128
FP8_ACT_AMAX_FLOOR = 1e-4  # official act_quant floor (as float32)
# Weight blocks: the smallest floor that keeps amax/448 a normal float32, so an all-zero block gets
# scale 2^-126 (byte 1) without losing precision on small but non-zero blocks.
FP8_WEIGHT_AMAX_FLOOR = E4M3_MAX * 2.0 ** -126


def _scale_and_bytes(amax: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """amax -> (float32 scale 2^k or NaN, UE8M0 bytes k+127 or 255)."""
    exp, finite = pow2_ceil_exponent(amax, E4M3_MAX, floor)
    scale = torch.where(finite, pow2_f32(exp), torch.full(exp.shape, float("nan"), device=amax.device))
    sbytes = torch.where(finite, exp + UE8M0_BIAS, torch.full_like(exp, UE8M0_NAN_BYTE)).to(torch.uint8)
    return scale, sbytes


def fp8_block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> ``(float8_e4m3fn [N, K], scales_ue8m0 uint8 [ceil(N/128), ceil(K/128)])``.

    Per 128x128 block (partial edge blocks allowed): ``s = 2^ceil(log2(amax/448))`` (computed as
    ``amax * fl32(1/448)``, amax floored at 448*2^-126, so an exact power of two is kept and nothing
    clips), ``q = E4M3_RNE(w / s)``. A block containing NaN/Inf gets scale byte 255 (NaN).
    """
    check_float(w, "fp8_block_quantize w")
    if w.dim() != 2:
        fail("fp8_block_quantize w shape", "[N, K]", list(w.shape))
    n, k = w.shape
    b = FP8_WEIGHT_BLOCK
    nb, kb = -(-n // b), -(-k // b)
    padded = torch.zeros((nb * b, kb * b), dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.to(torch.float32)  # zero padding does not change a block's amax
    blocks = padded.reshape(nb, b, kb, b)
    scale, sbytes = _scale_and_bytes(blocks.abs().amax(dim=(1, 3)), FP8_WEIGHT_AMAX_FLOOR)
    q = (blocks / scale[:, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX)
    return to_float8_e4m3fn(q.reshape(nb * b, kb * b)[:n, :k]).contiguous(), sbytes


def fp8_block_dequantize(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``float8_e4m3fn [N, K]`` and UE8M0 ``[ceil(N/128), ceil(K/128)]`` (uint8 or float8_e8m0fnu) -> float32."""
    check_dtype(w, "fp8_block_dequantize w", torch.float8_e4m3fn)
    s = as_bytes(scales, "fp8_block_dequantize scales", torch.float8_e8m0fnu)
    if w.dim() != 2:
        fail("fp8_block_dequantize w shape", "[N, K]", list(w.shape))
    n, k = w.shape
    b = FP8_WEIGHT_BLOCK
    check_shape(s, "fp8_block_dequantize scales", (-(-n // b), -(-k // b)))
    sf = ue8m0_decode(s.to(w.device))
    sf = sf.repeat_interleave(b, dim=0)[:n].repeat_interleave(b, dim=1)[:, :k]
    return e4m3_decode(w) * sf


def fp8_act_quantize(x: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` (K a multiple of ``block``) -> ``(float8_e4m3fn [..., K], ue8m0 uint8 [..., K/block])``.

    The official per-token activation quantizer with power-of-two scales (``block=128`` before FP8
    GEMMs; ``block=64`` for the KV cache dims [0, 448)). A block with NaN/Inf gets scale byte 255.
    """
    if not isinstance(block, int) or block <= 0:
        fail("fp8_act_quantize block", "a positive int", block)
    check_float(x, "fp8_act_quantize x")
    k = check_last_dim_multiple(x, "fp8_act_quantize x", block)
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], k // block, block)
    scale, sbytes = _scale_and_bytes(blocks.abs().amax(dim=-1), FP8_ACT_AMAX_FLOOR)
    q = (blocks / scale.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    return to_float8_e4m3fn(q.reshape(x.shape)), sbytes


def fp8_act_dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`fp8_act_quantize`; the block size is ``K / scales.shape[-1]`` -> float32."""
    check_dtype(q, "fp8_act_dequantize q", torch.float8_e4m3fn)
    s = as_bytes(scales, "fp8_act_dequantize scales", torch.float8_e8m0fnu)
    if q.dim() == 0 or s.dim() != q.dim() or s.shape[-1] == 0 or q.shape[-1] % s.shape[-1]:
        fail("fp8_act_dequantize shapes", "q [..., K] and scales [..., K/block]",
             f"q {list(q.shape)}, scales {list(s.shape)}")
    check_shape(s, "fp8_act_dequantize scales", (*q.shape[:-1], s.shape[-1]))
    block = q.shape[-1] // s.shape[-1]
    vals = e4m3_decode(q).reshape(*q.shape[:-1], s.shape[-1], block)
    return (vals * ue8m0_decode(s.to(q.device)).unsqueeze(-1)).reshape(q.shape)


def fp8_fake_quantize_pow2(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """``fp8_act_dequantize(*fp8_act_quantize(x, block)).to(x.dtype)``: the official in-place FP8 fake
    quantization (KV cache and compressor output use ``block=64`` on dims [0, 448), spec §12)."""
    return fp8_act_dequantize(*fp8_act_quantize(x, block)).to(x.dtype)
