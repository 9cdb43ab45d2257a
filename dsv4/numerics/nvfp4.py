"""NVFP4: E2M1 elements, one E4M3 scale per 16 elements along the last dim, one FP32 global scale.

Dequantization (spec nvfp4-and-kernels.md §3.4): ``x = e2m1(code) * float(scale_e4m3) * g``, where
``g`` is the *dequantization* global scale (ModelOpt ``weight_scale_2`` / ``input_scale``).
"""
from __future__ import annotations

import torch

from ._checks import (FP32_MIN_NORMAL, as_scalar_f32, check_dtype, check_float, check_last_dim_multiple,
                      check_shape, device_lut, fail)
from .e2m1 import E2M1_VALUES, e2m1_encode, pack_nibbles_unchecked
from .e4m3 import E4M3_MAX, e4m3_decode, e4m3_encode
from .swizzle import swizzled_numel, unswizzle_scales

NVFP4_BLOCK = 16
FP4_AMAX_PER_GLOBAL = 6.0 * E4M3_MAX  # 2688: amax / 2688 is the runtime global scale
RECIPES = ("exact", "rcp")
SCALE_LAYOUTS = ("linear", "swizzled")


def nvfp4_runtime_global_scale(x: torch.Tensor) -> torch.Tensor:
    """``g = max(amax(|x|) / 2688, 2^-126)`` as a 0-d float32 tensor (one IEEE float32 division).

    The floor keeps ``g`` a normal float32: an all-zero (or empty) tensor gets ``g = 2^-126`` and then
    all-zero scales and codes, and no scale product ``sf * g`` can underflow to 0. A NaN or Inf
    anywhere in ``x`` gives ``g = NaN``, which makes every block scale NaN (visible, not an error).
    """
    check_float(x, "nvfp4_runtime_global_scale x")
    xf = x.to(torch.float32)
    if xf.numel() == 0:
        return torch.tensor(FP32_MIN_NORMAL, dtype=torch.float32, device=x.device)
    amax = xf.abs().amax()
    # A tensor divisor on x's device, never a Python number: CUDA torch turns ``t / scalar`` into
    # ``t * (1 / scalar)``, one ulp off the IEEE division for some amax (the kernels divide).
    g = (amax / torch.full_like(amax, FP4_AMAX_PER_GLOBAL)).clamp(min=FP32_MIN_NORMAL)
    return torch.where(torch.isfinite(amax), g, torch.full_like(g, float("nan")))


def check_global_scale(g: torch.Tensor, name: str = "global_scale") -> None:
    """A static global scale must be finite and >= 2^-126 (one host read)."""
    v = float(g)
    if not (v >= FP32_MIN_NORMAL and v < float("inf")):
        fail(name, f"a finite float32 >= 2^-126 ({FP32_MIN_NORMAL:.3e})", v)


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor | float | None = None, *,
                   block_scale: torch.Tensor | None = None,
                   recipe: str = "exact") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (K a multiple of 16) to NVFP4.

    Returns ``(packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16] (linear), g float32 0-d)``.

    ``global_scale`` is the dequantization multiplier ``g`` (a Python float or a 0-d float32 tensor;
    it must be finite and >= 2^-126, else ``ValueError``). ``None`` uses the runtime amax:
    ``g = max(amax(|x|) / (6*448), 2^-126)`` (see :func:`nvfp4_runtime_global_scale`).

    Per 16-element block, with every operation an IEEE-rounded float32 operation (``x`` is first
    converted to float32; float16/bfloat16 convert exactly):

    1. ``amax_b = max |x|`` over the block;
    2. ``sf = amax_b / (6*g)`` (recipe ``"exact"``: ``6*g`` rounded, then one division) or
       ``sf = amax_b * r`` with ``r = 1/(6*g)`` (recipe ``"rcp"``: ``6*g`` rounded, its reciprocal
       rounded once, then one multiply);
    3. ``sf_e4m3 = E4M3_RNE(min(sf, 448))`` (explicit clamp; a non-finite ``amax_b`` gives NaN, byte 0x7F);
    4. if ``sf_e4m3 == 0`` every code of the block is 0;
    5. ``v = x / (float(sf_e4m3) * g)`` (``"exact"``) or ``v = x * (1 / (float(sf_e4m3) * g))``
       (``"rcp"``), the product ``float(sf_e4m3) * g`` rounded first in both recipes;
    6. ``code = E2M1_RNE(v)`` saturating at +-6 (:func:`e2m1_encode`: ties to the even code, the sign
       bit kept so -0.0 gives code 8, NaN gives code 7).

    ``block_scale`` (``float8_e4m3fn [..., K/16]``) replaces steps 1-3 with the given scales.

    Non-finite inputs propagate visibly instead of raising: a NaN/Inf in a block makes its scale NaN,
    so the whole block dequantizes to NaN; with a runtime global scale, ``g`` itself becomes NaN.
    """
    check_float(x, "nvfp4_quantize x")
    k = check_last_dim_multiple(x, "nvfp4_quantize x", NVFP4_BLOCK)
    if recipe not in RECIPES:
        fail("nvfp4_quantize recipe", f"one of {RECIPES}", repr(recipe))
    lead = tuple(x.shape[:-1])
    nb = k // NVFP4_BLOCK
    blocks = x.to(torch.float32).reshape(*lead, nb, NVFP4_BLOCK)
    if global_scale is None:
        g = nvfp4_runtime_global_scale(x)
    else:
        g = as_scalar_f32(global_scale, "nvfp4_quantize global_scale", x.device)
        check_global_scale(g, "nvfp4_quantize global_scale")
    one = torch.ones((), dtype=torch.float32, device=x.device)

    if block_scale is None:
        amax_b = blocks.abs().amax(dim=-1)
        six_g = g * 6.0
        sf = amax_b / six_g if recipe == "exact" else amax_b * (one / six_g)
        sf = torch.where(torch.isfinite(amax_b), sf, torch.full_like(sf, float("nan")))
        s_bytes = e4m3_encode(sf.clamp(max=E4M3_MAX))
    else:
        check_dtype(block_scale, "nvfp4_quantize block_scale", torch.float8_e4m3fn)
        check_shape(block_scale, "nvfp4_quantize block_scale", (*lead, nb))
        s_bytes = block_scale.to(x.device).view(torch.uint8)

    denom = (e4m3_decode(s_bytes) * g).unsqueeze(-1)
    v = blocks / denom if recipe == "exact" else blocks * (one / denom)
    codes = e2m1_encode(v)
    codes = torch.where(e4m3_decode(s_bytes).unsqueeze(-1) == 0, torch.zeros_like(codes), codes)
    packed = pack_nibbles_unchecked(codes.reshape(*lead, k))  # e2m1 codes: 0..15 by construction
    return packed, s_bytes.contiguous().view(torch.float8_e4m3fn), g


def nvfp4_dequantize(packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | float, *,
                     scale_layout: str = "linear") -> torch.Tensor:
    """NVFP4 -> float32: ``e2m1(code) * float(scale)`` (exact) times ``g`` (one float32 rounding).

    ``packed`` uint8 ``[..., K/2]``; ``scales`` float8_e4m3fn, ``linear`` ``[..., K/16]`` or, with
    ``scale_layout="swizzled"``, the flat 32_4_4 layout of a 2-D ``packed [R, K/2]``
    (``round_up(R,128) * round_up(K/16,4)`` elements, see :func:`swizzle_scales`). ``global_scale`` is a
    Python float or a 0-d float32 tensor, used as given (0 or NaN propagate).
    """
    check_dtype(packed, "nvfp4_dequantize packed", torch.uint8)
    check_dtype(scales, "nvfp4_dequantize scales", torch.float8_e4m3fn)
    if packed.dim() == 0:
        fail("nvfp4_dequantize packed shape", "[..., K/2]", "a 0-d tensor")
    k = 2 * int(packed.shape[-1])
    if k == 0 or k % NVFP4_BLOCK:
        fail("nvfp4_dequantize packed last dim", f"K/2 with K a positive multiple of {NVFP4_BLOCK}", k // 2)
    nb = k // NVFP4_BLOCK
    lead = tuple(packed.shape[:-1])
    if scale_layout == "linear":
        check_shape(scales, "nvfp4_dequantize scales (linear)", (*lead, nb))
    elif scale_layout == "swizzled":
        if packed.dim() != 2:
            fail("nvfp4_dequantize packed shape (swizzled scales)", "2-D [R, K/2]", list(packed.shape))
        want = swizzled_numel(lead[0], nb)
        if scales.dim() != 1 or scales.numel() != want:
            fail("nvfp4_dequantize scales (swizzled)", f"1-D with {want} elements", list(scales.shape))
        scales = unswizzle_scales(scales, lead[0], nb)
    else:
        fail("nvfp4_dequantize scale_layout", f"one of {SCALE_LAYOUTS}", repr(scale_layout))
    # x * 1.0 == x for every float (NaN stays NaN): the audit and the weight decodes pass 1.0, and
    # skipping that pass saves a read and a write of the whole FP32 result
    unit = isinstance(global_scale, float) and global_scale == 1.0
    g = None if unit else as_scalar_f32(global_scale, "nvfp4_dequantize global_scale", packed.device)
    block = decode_packed_pairs(packed).reshape(*lead, nb, NVFP4_BLOCK)
    block.mul_(e4m3_decode(scales.to(packed.device)).unsqueeze(-1))  # exact: <= 6 significant bits
    if g is not None:
        block.mul_(g)
    return block.reshape(*lead, k)


def _pair_table() -> torch.Tensor:
    """``[256, 2]`` float32: a packed byte's two E2M1 values, low nibble first."""
    v = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    b = torch.arange(256)
    return torch.stack((v[b & 0x0F], v[b >> 4]), dim=-1)


def decode_packed_pairs(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K/2]`` -> float32 ``[..., K]`` E2M1 values (low nibble first), unscaled.

    One gather from a 256-entry table of value pairs, with 32-bit indices: the same values as
    ``decode_codes_unchecked(unpack_nibbles(packed))`` with about a third of its memory traffic (that
    form writes the codes, their 64-bit indices and the values; a Pro-sized expert bank is 1.7e10
    elements and the per-call audit decodes it on every routed call)."""
    lut = device_lut("e2m1-pairs", packed.device, _pair_table)
    flat = lut.index_select(0, packed.reshape(-1).to(torch.int32))
    return flat.reshape(*packed.shape[:-1], 2 * int(packed.shape[-1]))
