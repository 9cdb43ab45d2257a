"""Edge validation shared by the numerics functions: one ``ValueError`` naming expected vs found."""
from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# Smallest normal fp32 number; the floor of every runtime global scale (see nvfp4.py).
FP32_MIN_NORMAL = 2.0 ** -126


def fail(what: str, expected: str, found: object) -> None:
    raise ValueError(f"{what}: expected {expected}, found {found}")


def check_tensor(x: object, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        fail(name, "a torch.Tensor", type(x).__name__)
    return x  # type: ignore[return-value]


def check_float(x: object, name: str) -> torch.Tensor:
    t = check_tensor(x, name)
    if t.dtype not in FLOAT_DTYPES:
        fail(f"{name} dtype", "one of float16, bfloat16, float32, float64", t.dtype)
    return t


def check_dtype(x: object, name: str, *dtypes: torch.dtype) -> torch.Tensor:
    t = check_tensor(x, name)
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        fail(f"{name} dtype", want, t.dtype)
    return t


def check_last_dim_multiple(x: torch.Tensor, name: str, block: int) -> int:
    """Return the last dim K after checking ``x.dim() >= 1`` and ``K`` a positive multiple of ``block``."""
    if x.dim() == 0:
        fail(f"{name} shape", f"[..., K] with K a positive multiple of {block}", "a 0-d tensor")
    k = int(x.shape[-1])
    if k <= 0 or k % block:
        fail(f"{name} last dim", f"a positive multiple of {block}", k)
    return k


def check_shape(x: torch.Tensor, name: str, want: tuple[int, ...]) -> None:
    if tuple(x.shape) != tuple(want):
        fail(f"{name} shape", str(list(want)), list(x.shape))


def as_scalar_f32(g: object, name: str, device: torch.device) -> torch.Tensor:
    """A Python real or a 0-d float32 tensor -> a 0-d float32 tensor on ``device`` (no validation of the value)."""
    if isinstance(g, bool):
        fail(name, "a real number or a 0-d float32 tensor", g)
    if isinstance(g, (int, float)):   # a fill on the device: no host-to-device copy (a sync on CUDA)
        return torch.full((), float(g), dtype=torch.float32, device=device)
    t = check_tensor(g, name)
    if t.dim() != 0 or t.dtype != torch.float32:
        fail(name, "a 0-d float32 tensor (or a Python float)", f"{t.dtype} {list(t.shape)}")
    return t.to(device)


def as_bytes(x: torch.Tensor, name: str, *alt: torch.dtype) -> torch.Tensor:
    """View a tensor of a 1-byte dtype (uint8 or one of ``alt``) as uint8."""
    check_dtype(x, name, torch.uint8, *alt)
    return x if x.dtype == torch.uint8 else x.view(torch.uint8)


_LUTS: dict[tuple[str, torch.device], torch.Tensor] = {}


def device_lut(name: str, device: torch.device, build) -> torch.Tensor:
    """A decode table built once per device (``build()`` on the CPU, copied once): a per-call
    ``torch.tensor(..., device="cuda")`` is a synchronizing host-to-device copy on every call."""
    key = (name, torch.device(device))
    t = _LUTS.get(key)
    if t is None:
        t = build().to(key[1])
        _LUTS[key] = t
    return t
