"""MXFP4 (OCP MX): E2M1 elements with one UE8M0 power-of-two scale per 32 elements, no global scale.

This is the official checkpoint's routed-expert format (spec dsv4-architecture.md §2.3):
``W[o, i] = e2m1(nib(o, i)) * 2^(S[o, i // 32] - 127)``. The same power-of-two FP4 quantization,
dequantized straight back, is the indexer's fake quantization (spec §12).
"""
from __future__ import annotations

import torch

from ._checks import as_bytes, check_float, check_last_dim_multiple, check_shape, fail
from .e2m1 import E2M1_MAX, decode_codes_unchecked, e2m1_encode, pack_nibbles, unpack_nibbles
from .e4m3 import pow2_f32
from .ue8m0 import UE8M0_BIAS, UE8M0_NAN_BYTE, pow2_ceil_exponent, ue8m0_decode

MXFP4_BLOCK = 32
# Official FP4 amax floor (inference/kernel.py ``fp4_quant_kernel``): keeps amax/6 a normal float32.
FP4_AMAX_FLOOR = 6.0 * 2.0 ** -126


def _fp4_pow2_blocks(x: torch.Tensor, block: int, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shared core: ``x [..., K]`` -> (codes ``[..., K/block, block]``, exponent int32, finite mask).

    Per block: ``s = 2^ceil(log2(max(amax, 6*2^-126) * fl32(1/6)))`` (the official fast_round_scale,
    never clips), ``code = E2M1_RNE(x / s)`` (division by a power of two: exact).
    """
    check_float(x, name)
    k = check_last_dim_multiple(x, name, block)
    blocks = x.to(torch.float32).reshape(*x.shape[:-1], k // block, block)
    exp, finite = pow2_ceil_exponent(blocks.abs().amax(dim=-1), E2M1_MAX, FP4_AMAX_FLOOR)
    scale = torch.where(finite, pow2_f32(exp), torch.full(exp.shape, float("nan"), device=x.device))
    codes = e2m1_encode((blocks / scale.unsqueeze(-1)).clamp(-E2M1_MAX, E2M1_MAX))
    return codes, exp, finite


def mxfp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., K]`` (K a multiple of 32) -> ``(packed uint8 [..., K/2], scales_ue8m0 uint8 [..., K/32])``.

    Scale rule (chosen to match the official FP4 quantizer): the smallest power of two ``s`` with
    ``amax <= 6 * s`` as computed by ``2^ceil(log2(amax * fl32(1/6)))``, amax floored at 6*2^-126,
    so nothing clips; byte = log2(s) + 127, in [1, 253]. A block containing NaN/Inf gets byte 255
    (NaN) and its codes are 7. Codes are RNE with ties to even (:func:`e2m1_encode`).
    """
    codes, exp, finite = _fp4_pow2_blocks(x, MXFP4_BLOCK, "mxfp4_quantize x")
    sbytes = torch.where(finite, exp + UE8M0_BIAS, torch.full_like(exp, UE8M0_NAN_BYTE)).to(torch.uint8)
    return pack_nibbles(codes.reshape(x.shape)), sbytes


def mxfp4_dequantize(packed: torch.Tensor, scales_ue8m0: torch.Tensor) -> torch.Tensor:
    """``packed`` uint8/int8 ``[..., K/2]``, ``scales_ue8m0`` uint8/float8_e8m0fnu ``[..., K/32]`` -> float32.

    ``e2m1 * 2^(e-127)``, one float32 multiply (exact unless the product is an fp32 subnormal).
    """
    p = as_bytes(packed, "mxfp4_dequantize packed", torch.int8)
    s = as_bytes(scales_ue8m0, "mxfp4_dequantize scales_ue8m0", torch.float8_e8m0fnu)
    if p.dim() == 0:
        fail("mxfp4_dequantize packed shape", "[..., K/2]", "a 0-d tensor")
    k = 2 * int(p.shape[-1])
    if k == 0 or k % MXFP4_BLOCK:
        fail("mxfp4_dequantize packed last dim", f"K/2 with K a positive multiple of {MXFP4_BLOCK}", k // 2)
    lead = tuple(p.shape[:-1])
    check_shape(s, "mxfp4_dequantize scales_ue8m0", (*lead, k // MXFP4_BLOCK))
    vals = decode_codes_unchecked(unpack_nibbles(p)).reshape(*lead, k // MXFP4_BLOCK, MXFP4_BLOCK)
    return (vals * ue8m0_decode(s.to(p.device)).unsqueeze(-1)).reshape(*lead, k)


def fp4_fake_quantize_pow2(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """The indexer's FP4 fake quantization (spec §12, official ``fp4_act_quant(inplace=True)``).

    Per ``block`` elements of the last dim: ``s = 2^ceil(log2(amax/6))`` (as in :func:`mxfp4_quantize`),
    ``y = E2M1_RNE(clamp(x/s, -6, 6)) * s``, returned in ``x.dtype``. With ``block=32`` this equals
    ``mxfp4_dequantize(*mxfp4_quantize(x)).to(x.dtype)``. NaN/Inf in a block -> the block is NaN.
    """
    if not isinstance(block, int) or block <= 0:
        fail("fp4_fake_quantize_pow2 block", "a positive int", block)
    codes, exp, finite = _fp4_pow2_blocks(x, block, "fp4_fake_quantize_pow2 x")
    scale = torch.where(finite, pow2_f32(exp), torch.full(exp.shape, float("nan"), device=x.device))
    y = decode_codes_unchecked(codes) * scale.unsqueeze(-1)
    return y.reshape(x.shape).to(x.dtype)
