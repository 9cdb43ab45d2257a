"""Synthetic checkpoints at real width, generated and quantized on the GPU (or any torch device).

``dsv4.checkpoint.synth`` draws every value with numpy's PCG64 and encodes on the CPU: right for the
tiny models, minutes per layer at Flash/Pro width (a Pro layer holds 25 G expert weights). This
module keeps the project's own pieces — the weight list and encoding units (``_check_request``,
``_units``), each weight's format per layout (``linear_format``), the stored names
(``_store_roles``), the NVFP4 global-scale rule (``_nvfp4_global``) and the writer
(``write_checkpoint``) — and replaces only the two CPU-bound steps: values of linears and tables are
drawn with torch on ``device`` (same gains and block structure, other random numbers), and the FP8 /
MXFP4 / NVFP4 encoders are ported to torch, byte-identical to synth's for the same values
(tests/benchmarks/test_real_width_synth.py). Small tensors (norms, mHC parameters, the hash table)
come from synth's own generator.
"""
from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterator

import torch

from dsv4.checkpoint import synth as S
from dsv4.checkpoint.names import LINEAR, TABLE, WeightSpec
from dsv4.config import DSV4Config

_MID = S._E2M1_MIDPOINTS


def _gen(seed: int, name: str, device: str) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((seed << 32) ^ zlib.crc32(name.encode()))
    return g


def linear_values(spec: WeightSpec, seed: int, device: str) -> torch.Tensor:
    """synth._linear_values' recipe (gain / sqrt(k), 128x128 block and row magnitudes) with torch's RNG."""
    n, k = spec.shape
    g = _gen(seed, spec.full_name, device)
    leaf = spec.name.rsplit(".", 1)[-1]
    gain = S._GAINS.get(spec.name, S._GAINS.get(leaf, 1.0))
    w = torch.randn((n, k), generator=g, device=device, dtype=torch.float32) * (gain / k ** 0.5)
    bm = 2.0 ** (torch.rand((-(-n // 128), -(-k // 128)), generator=g, device=device) * 1.4 - 0.7)
    w *= bm.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    w *= 2.0 ** (torch.rand((n, 1), generator=g, device=device) * 0.8 - 0.4)
    return w


def table_values(spec: WeightSpec, seed: int, device: str) -> torch.Tensor:
    scale = 1.0 if spec.name == "embed" else S._GAINS["head"] / spec.shape[1] ** 0.5
    return torch.randn(spec.shape, generator=_gen(seed, spec.full_name, device), device=device) * scale


# ---- encoders: synth's, in torch (same arithmetic: fp32 values, exponents from a float64 log2) --------
def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    a = v.abs().clamp(max=6.0)
    mid = torch.tensor(_MID, dtype=a.dtype, device=a.device)
    mag = torch.searchsorted(mid, a.contiguous(), right=False)
    odd_tie = (mag % 2 == 1) & (a == mid[mag.clamp(max=len(_MID) - 1)])
    mag = (mag + odd_tie.to(mag.dtype)).to(torch.uint8)
    mag[torch.isnan(a)] = 0
    return mag | (((v < 0) & (mag > 0)).to(torch.uint8) * 8)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def _pow2_exponent(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    return torch.ceil(torch.log2(amax.to(torch.float64).clamp(min=1e-30) / qmax)).to(torch.int64)


def _e8m0(e: torch.Tensor) -> torch.Tensor:
    return (e + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def encode_fp8_block(w: torch.Tensor) -> dict[str, torch.Tensor]:
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    pad = torch.zeros((nb * 128, kb * 128), dtype=w.dtype, device=w.device)
    pad[:n, :k] = w
    e = _pow2_exponent(pad.abs().reshape(nb, 128, kb, 128).amax(dim=(1, 3)), 448.0)
    scale = (2.0 ** e.to(torch.float64)).to(w.dtype).repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return {"weight": _e4m3(w / scale), "scale": _e8m0(e)}


def encode_mxfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    e = _pow2_exponent(blocks.abs().amax(dim=2), 6.0)
    codes = e2m1_codes(blocks / (2.0 ** e.to(torch.float64)).to(w.dtype)[..., None]).reshape(n, k)
    return {"weight": _pack(codes).view(torch.int8), "scale": _e8m0(e)}


def encode_nvfp4(w: torch.Tensor, global_scale: float) -> dict[str, torch.Tensor]:
    n, k = w.shape
    gs = float(torch.tensor(global_scale, dtype=torch.float32))
    blocks = w.to(torch.float64).reshape(n, k // 16, 16)
    sf = _e4m3((blocks.abs().amax(dim=2) / (6.0 * gs)).to(torch.float32))
    denom = sf.to(torch.float32).to(torch.float64)[..., None] * gs
    q = torch.where(denom > 0, blocks / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(blocks))
    codes = e2m1_codes(q).reshape(n, k)
    return {"weight": _pack(codes), "weight_scale": sf, "weight_scale_2": torch.tensor(gs, dtype=torch.float32),
            "input_scale": torch.tensor(S._INPUT_AMAX_BOUND / (6.0 * 448.0), dtype=torch.float32)}


def _encode(spec: WeightSpec, v: torch.Tensor, c: DSV4Config, flavor: str, gs: float | None = None) -> dict:
    fmt = S.linear_format(spec, c, flavor, "bf16")
    if fmt == "fp8":
        roles = encode_fp8_block(v)
    elif fmt == "mxfp4":
        roles = encode_mxfp4(v)
    elif fmt == "nvfp4":
        roles = encode_nvfp4(v, gs if gs is not None else S._nvfp4_global(None, flavor, float(v.abs().max())))
    else:
        roles = {"weight": v.to(torch.bfloat16)}
    return {k: t.cpu() for k, t in S._store_roles(spec, roles, flavor).items()}


def iter_tensors(c: DSV4Config, flavor: str, seed: int = 0, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """(stored name, tensor) of every weight of ``c`` in layout ``flavor``, unit by unit (synth's units:
    an expert's NVFP4 w1 and w3 share one global scale)."""
    for unit in S._units(S._check_request(c, flavor, "bf16"), c, flavor, "bf16"):
        spec = unit[0]
        if spec.kind == LINEAR:
            vs = [linear_values(s, seed, device) for s in unit]
            gs = None
            if len(unit) == 2:
                gs = S._nvfp4_global(None, flavor, max(float(v.abs().max()) for v in vs))
            for s, v in zip(unit, vs):
                yield from _encode(s, v, c, flavor, gs).items()
        elif spec.kind == TABLE:
            yield from S._store_roles(spec, {"weight": table_values(spec, seed, device).to(torch.bfloat16).cpu()},
                                      flavor).items()
        else:
            yield from S._stored(spec, c, flavor, "bf16", S.synthetic_values(spec, c, seed)).items()


def write(out: str | Path, c: DSV4Config, flavor: str, *, seed: int = 0, device: str = "cpu",
          shard_bytes: int = 1 << 30) -> Path:
    """Write the checkpoint with the project's writer; returns its directory."""
    out = Path(out)
    S.write_checkpoint(out, c, iter_tensors(c, flavor, seed, device), flavor, shard_bytes)
    return out


__all__ = ["e2m1_codes", "encode_fp8_block", "encode_mxfp4", "encode_nvfp4", "iter_tensors", "linear_values", "write"]
