"""The data path of the prefill route's FP4 -> BF16 kernel (``sm90/dequant_kernel.py``) on the CPU: its
block -> address mapping, its decode (``DECODE8_PAIRS`` through the PTX interpreter), the word and half
order of its stores and its swizzled scale offsets, against ``dsv4.numerics.nvfp4_dequantize``. The
GPU test (``test_sm90_prefill_gemm_gpu.py``) runs the kernel itself."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dsv4.numerics import e4m3_decode, nvfp4_dequantize, swizzle_scales, to_float8_e4m3fn

sys.path.insert(0, str(Path(__file__).parent))
from ptx_interp import _run_ptx_np  # noqa: E402

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
from dsv4.kernels.cutedsl.sm90.decode_ptx import DECODE8_PAIRS  # noqa: E402
from dsv4.kernels.cutedsl.scale_offsets import swizzled_scale_offset  # noqa: E402


def _kernel_model(packed: torch.Tensor, scales_flat: np.ndarray, rows: int, k: int, swizzled: bool) -> torch.Tensor:
    """What each thread of the kernel writes, block ``idx`` by block ``idx``, as BF16 ``[rows, k]``."""
    nbk = k // 16
    sc_pad = (nbk + 3) // 4 * 4
    idx = np.arange(rows * nbk)
    words = packed.numpy().reshape(-1).view(np.uint32).reshape(-1, 2)  # ld.global.nc.v2.b32 at idx * 8
    soff = swizzled_scale_offset(idx // nbk, idx % nbk, sc_pad) if swizzled else idx
    sval = e4m3_decode(torch.from_numpy(scales_flat[soff].copy()).view(torch.float8_e4m3fn)).numpy()
    h = sval.astype(np.float16).view(np.uint16).astype(np.uint32)
    scale_x2 = h | (h << 16)                                             # cvt.rn.f16x2.e4m3x2 + broadcast
    out = np.zeros((rows * nbk, 16), dtype=np.float32)
    for w in range(2):
        dec = _run_ptx_np(DECODE8_PAIRS, [words[:, w], scale_x2], 4)
        for j, word in enumerate(dec):                                   # cvt.rn.bf16x2.f32 d, hi, lo
            lo = (word & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
            hi = (word >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
            out[:, 8 * w + 2 * j], out[:, 8 * w + 2 * j + 1] = lo, hi
    return torch.from_numpy(out).reshape(rows, k).to(torch.bfloat16)  # exact: <= 6 significant bits


@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("rows,k", [(1, 16), (37, 80), (130, 64), (256, 208)])
def test_dequant_datapath_equals_nvfp4_dequantize(rows, k, swizzled):
    gen = torch.Generator().manual_seed(rows * 1000 + k)
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, generator=gen)
    mag = torch.exp2(torch.rand(rows, k // 16, generator=gen) * 16 - 9)
    mag[torch.rand(rows, k // 16, generator=gen) < 0.05] = 0.0
    scales = to_float8_e4m3fn(mag)
    scales.view(torch.uint8)[0, 0] = 0x7F                                 # a NaN block scale
    stored = swizzle_scales(scales) if swizzled else scales
    flat = stored.reshape(-1).view(torch.uint8).numpy()
    got = _kernel_model(packed, flat, rows, k, swizzled)
    want = nvfp4_dequantize(packed, scales, 1.0)
    assert torch.equal(got.float().isnan(), want.isnan())
    fin = ~want.isnan()
    assert torch.equal(got.float()[fin], want[fin])
    assert torch.equal(torch.signbit(got.float()[fin]), torch.signbit(want[fin]))


def test_swizzled_offsets_are_a_bijection_onto_the_padded_layout():
    rows, nbk = 300, 13
    sc_pad = 16
    r, c = np.meshgrid(np.arange(rows), np.arange(nbk), indexing="ij")
    offs = swizzled_scale_offset(r.reshape(-1), c.reshape(-1), sc_pad)
    assert len(set(offs.tolist())) == rows * nbk
    assert offs.max() < -(-rows // 128) * 128 * sc_pad
