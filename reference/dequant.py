"""PyTorch dequantization of every stored weight format the reader reports (spec §2.3, §2.4).

Deliberately independent of the native side's decoder (design principle 2): a bug shared by both
would be invisible. Every function checks roles, dtypes and shapes before it indexes anything and
returns fp32 (int64 for the hash table); the caller decides the working dtype.
"""
from __future__ import annotations

import torch

from dsv4.checkpoint.errors import CheckpointError
from dsv4.checkpoint.formats import DENSE, FP8_BLOCK, HASH, MXFP4, NVFP4, RAW, StoredWeight

# §2.3: E2M1 sign-magnitude codes 0..15.
E2M1_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _fail(sw: StoredWeight, role: str, what: str, expected: object, found: object) -> CheckpointError:
    name = sw.names.get(role, role)
    return CheckpointError(f"dequantize '{name}' ({sw.fmt.kind}): {what}: expected {expected}, found {found}")


def _tensor(sw: StoredWeight, role: str, dtypes: tuple[torch.dtype, ...], shape: tuple[int, ...] | None
            ) -> torch.Tensor:
    t = sw.tensors.get(role)
    if t is None:
        raise _fail(sw, role, "role", f"a '{role}' tensor", sorted(sw.tensors))
    if t.dtype not in dtypes:
        raise _fail(sw, role, "dtype", " or ".join(map(str, dtypes)), t.dtype)
    if shape is not None and tuple(t.shape) != shape:
        raise _fail(sw, role, "shape", list(shape), list(t.shape))
    return t


def ue8m0_exponent(scale: torch.Tensor, sw: StoredWeight, role: str = "scale") -> torch.Tensor:
    """UE8M0 byte b -> exponent b - 127 (int32). Byte 255 encodes NaN: a corrupt scale, refused."""
    b = scale.view(torch.uint8) if scale.dtype == torch.float8_e8m0fnu else scale
    if bool((b == 255).any()):
        raise _fail(sw, role, "UE8M0 bytes", "< 255 (255 is NaN)", "a 255 byte")
    return b.to(torch.int32) - 127


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] bytes -> [N, K] fp32: element 2k is the LOW nibble of byte k, 2k+1 the high one (§2.3)."""
    b = packed.view(torch.uint8) if packed.dtype == torch.int8 else packed
    lut = torch.tensor(E2M1_LUT, dtype=torch.float32, device=b.device)
    lo, hi = (b & 0x0F).long(), (b >> 4).long()
    return torch.stack((lut[lo], lut[hi]), dim=-1).reshape(*b.shape[:-1], 2 * b.shape[-1])


def _expand(scale: torch.Tensor, rows: int, cols: int, shape: tuple[int, int]) -> torch.Tensor:
    """Blow a per-block scale grid up to element resolution and crop to the logical shape."""
    full = scale.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)
    return full[: shape[0], : shape[1]]


def dequant_dense(sw: StoredWeight) -> torch.Tensor:
    shape = sw.fmt.shape
    t = _tensor(sw, "weight", _FLOATS, None)
    if tuple(t.shape) != shape and not (t.numel() == 1 and shape == (1,)):
        raise _fail(sw, "weight", "shape", list(shape), list(t.shape))
    return t.float().reshape(shape)


def dequant_index(sw: StoredWeight) -> torch.Tensor:
    return _tensor(sw, "weight", (torch.int64, torch.int32), sw.fmt.shape).long()


def dequant_fp8_block(sw: StoredWeight) -> torch.Tensor:
    """§2.3: W[o,i] = e4m3(W[o,i]) * 2^(S[o//128, i//128] - 127); Flash-Base stores F32 scales."""
    n, k = sw.fmt.shape
    w = _tensor(sw, "weight", (torch.float8_e4m3fn,), (n, k))
    grid = (-(-n // 128), -(-k // 128))
    s = _tensor(sw, "scale", (torch.float8_e8m0fnu, torch.uint8, torch.float32), grid)
    if s.dtype == torch.float32:
        return w.float() * _expand(s, 128, 128, (n, k))
    return torch.ldexp(w.float(), _expand(ue8m0_exponent(s, sw), 128, 128, (n, k)))


def dequant_mxfp4(sw: StoredWeight) -> torch.Tensor:
    """§2.3 (OCP MXFP4): W[o,i] = LUT[nibble(o,i)] * 2^(S[o, i//32] - 127)."""
    n, k = sw.fmt.shape
    if k % 32:
        raise _fail(sw, "weight", "logical in-features", "a multiple of 32", k)
    w = _tensor(sw, "weight", (torch.int8, torch.uint8), (n, k // 2))
    s = _tensor(sw, "scale", (torch.float8_e8m0fnu, torch.uint8), (n, k // 32))
    return torch.ldexp(unpack_e2m1(w), ue8m0_exponent(s, sw).repeat_interleave(32, dim=1))


def dequant_nvfp4(sw: StoredWeight) -> torch.Tensor:
    """§2.4: W[o,i] = LUT[nibble(o,i)] * e4m3(weight_scale[o, i//16]) * weight_scale_2.

    LUT * e4m3 is exact in fp32 (2 + 4 significant bits), so the single rounding happens at the
    multiplication by the fp32 global scale: the result is the correctly rounded product."""
    n, k = sw.fmt.shape
    if k % 16:
        raise _fail(sw, "weight", "logical in-features", "a multiple of 16", k)
    w = _tensor(sw, "weight", (torch.uint8, torch.int8), (n, k // 2))
    s = _tensor(sw, "weight_scale", (torch.float8_e4m3fn,), (n, k // 16))
    g = _tensor(sw, "weight_scale_2", (torch.float32,), None)
    if g.numel() != 1:
        raise _fail(sw, "weight_scale_2", "shape", "a scalar", list(g.shape))
    if not bool(torch.isfinite(s.float()).all()):
        raise _fail(sw, "weight_scale", "values", "finite E4M3 scales", "NaN")
    return (unpack_e2m1(w) * s.float().repeat_interleave(16, dim=1)) * g.float().reshape(())


_DEQUANT = {DENSE: dequant_dense, RAW: dequant_dense, HASH: dequant_index, FP8_BLOCK: dequant_fp8_block,
            MXFP4: dequant_mxfp4, NVFP4: dequant_nvfp4}


def dequantize(sw: StoredWeight) -> torch.Tensor:
    """Logical fp32 tensor (int64 for ``index``) of one stored weight, on the device of its tensors."""
    fn = _DEQUANT.get(sw.fmt.kind)
    if fn is None:
        raise CheckpointError(f"dequantize: format kind: expected one of {sorted(_DEQUANT)}, found {sw.fmt.kind!r}")
    return fn(sw)
