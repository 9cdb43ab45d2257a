"""Dequantization of every stored format against hand-built tensors (spec §2.3, §2.4)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4.checkpoint.errors import CheckpointError
from dsv4.checkpoint.formats import DENSE, FP8_BLOCK, HASH, MXFP4, NVFP4, RAW, StoredWeight, WeightFormat
from dsv4.checkpoint.synth import encode_fp8_block, encode_mxfp4, encode_nvfp4
from reference.dequant import dequantize, unpack_e2m1


def sw(kind: str, shape: tuple[int, ...], **tensors: torch.Tensor) -> StoredWeight:
    return StoredWeight(dict(tensors), WeightFormat(kind, shape, "x"), {r: f"w.{r}" for r in tensors})


def e8m0(exponents: list[list[int]]) -> torch.Tensor:
    return (torch.tensor(exponents, dtype=torch.int32) + 127).to(torch.uint8).view(torch.float8_e8m0fnu)


def test_unpack_low_nibble_first() -> None:
    # byte 0x71: low nibble 1 (0.5) is element 0, high nibble 7 (6.0) element 1; 0xF8: -0 then -6.
    out = unpack_e2m1(torch.tensor([[0x71, 0xF8]], dtype=torch.uint8))
    assert out.tolist() == [[0.5, 6.0, -0.0, -6.0]]
    assert torch.equal(unpack_e2m1(torch.tensor([[0x71]], dtype=torch.uint8).view(torch.int8)),
                       torch.tensor([[0.5, 6.0]]))


def test_fp8_block_ue8m0_partial_blocks() -> None:
    # 130 x 260: a 2 x 3 grid whose last row/column blocks are partial.
    w = torch.full((130, 260), 1.5).to(torch.float8_e4m3fn)
    exps = [[0, 1, -2], [3, -1, 5]]
    out = dequantize(sw(FP8_BLOCK, (130, 260), weight=w, scale=e8m0(exps)))
    for bi, rows in enumerate((slice(0, 128), slice(128, 130))):
        for bj, cols in enumerate((slice(0, 128), slice(128, 256), slice(256, 260))):
            assert torch.all(out[rows, cols] == 1.5 * 2.0 ** exps[bi][bj])
    # the same scale as raw U8 bytes, and as F32 (Flash-Base) values
    u8 = e8m0(exps).view(torch.uint8)
    assert torch.equal(dequantize(sw(FP8_BLOCK, (130, 260), weight=w, scale=u8)), out)
    f32 = torch.tensor(exps, dtype=torch.float32).exp2()
    assert torch.equal(dequantize(sw(FP8_BLOCK, (130, 260), weight=w, scale=f32)), out)


def test_mxfp4_hand_built() -> None:
    # one row of 64: codes 0..15 repeated, scale 2^1 for the first 32, 2^-3 for the next 32
    codes = torch.arange(64) % 16
    packed = (codes[0::2] | (codes[1::2] << 4)).to(torch.uint8).view(torch.int8).reshape(1, 32)
    out = dequantize(sw(MXFP4, (1, 64), weight=packed, scale=e8m0([[1, -3]])))
    lut = [0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6]
    want = [lut[c] * (2.0 if i < 32 else 0.125) for i, c in enumerate(codes.tolist())]
    assert out.tolist() == [want]


def test_nvfp4_hand_built() -> None:
    codes = torch.tensor([[3, 7, 9, 15] * 8])                       # 1.5, 6, -0.5, -6 ...
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scale = torch.tensor([[0.75, 20.0]]).to(torch.float8_e4m3fn)  # exact E4M3 values
    g = torch.tensor(0.1, dtype=torch.float32)
    out = dequantize(sw(NVFP4, (1, 32), weight=packed, weight_scale=scale, weight_scale_2=g))
    lut = {3: 1.5, 7: 6.0, 9: -0.5, 15: -6.0}
    want = torch.tensor([[lut[c] * (0.75 if i < 16 else 20.0) for i, c in enumerate(codes[0].tolist())]])
    assert torch.equal(out, want * g)   # LUT*scale exact, one rounding at the global scale


def test_dense_param_index() -> None:
    b = torch.randn(4, 3).to(torch.bfloat16)
    assert torch.equal(dequantize(sw(DENSE, (4, 3), weight=b)), b.float())
    assert dequantize(sw(RAW, (1,), weight=torch.tensor(2.5))).shape == (1,)   # [] stored, [1] logical
    t = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
    out = dequantize(sw(HASH, (2, 2), weight=t))
    assert out.dtype == torch.int64 and out.tolist() == [[1, 2], [3, 0]]


@pytest.mark.parametrize("encode,kind,tol", [(encode_fp8_block, FP8_BLOCK, 2 ** -3),
                                             (encode_mxfp4, MXFP4, 2 ** -1), (encode_nvfp4, NVFP4, 2 ** -1)])
def test_roundtrip_against_the_synth_encoders(encode, kind: str, tol: float) -> None:
    """An independent encoder (dsv4.checkpoint.synth) followed by our decoder gives back the values
    within the format's rounding (relative to each block's amax)."""
    w = np.random.default_rng(0).standard_normal((256, 384)).astype(np.float32)
    out = dequantize(sw(kind, w.shape, **encode(w))).numpy()
    blk = 128 if kind == FP8_BLOCK else 32
    amax = np.abs(w).reshape(256, -1, blk).max(-1).repeat(blk, axis=1)
    assert np.all(np.abs(out - w) <= tol * amax / 2 + 1e-7)
    assert np.corrcoef(out.ravel(), w.ravel())[0, 1] > (0.999 if kind == FP8_BLOCK else 0.99)


def test_bad_inputs_are_refused_before_indexing() -> None:
    w = torch.zeros(128, 128).to(torch.float8_e4m3fn)
    with pytest.raises(CheckpointError, match="shape"):
        dequantize(sw(FP8_BLOCK, (128, 128), weight=w, scale=e8m0([[0, 0]])))
    with pytest.raises(CheckpointError, match="255"):
        dequantize(sw(FP8_BLOCK, (128, 128), weight=w, scale=torch.tensor([[255]], dtype=torch.uint8)))
    with pytest.raises(CheckpointError, match="role"):
        dequantize(sw(FP8_BLOCK, (128, 128), weight=w))
    with pytest.raises(CheckpointError, match="dtype"):
        dequantize(sw(MXFP4, (1, 64), weight=torch.zeros(1, 32, dtype=torch.float32), scale=e8m0([[0, 0]])))
    with pytest.raises(CheckpointError, match="scalar"):
        dequantize(sw(NVFP4, (1, 16), weight=torch.zeros(1, 8, dtype=torch.uint8),
                      weight_scale=torch.ones(1, 1).to(torch.float8_e4m3fn), weight_scale_2=torch.ones(2)))
    with pytest.raises(CheckpointError, match="kind"):
        dequantize(sw("bogus", (1,), weight=torch.zeros(1)))


def test_every_weight_of_the_tiny_checkpoint(tiny_path) -> None:
    """Every stored weight of the built-in checkpoint dequantizes to its logical shape, finite."""
    from dsv4.checkpoint.reader import open_checkpoint

    r = open_checkpoint(tiny_path)
    kinds = set()
    for layer in [None, *range(r.config.num_hidden_layers)]:
        for name in r.weight_names(layer):
            s = r.weight(name, layer)
            out = dequantize(s)
            kinds.add(s.fmt.kind)
            assert tuple(out.shape) == s.fmt.shape, name
            assert out.dtype == torch.int64 or bool(torch.isfinite(out).all()), name
    assert {DENSE, FP8_BLOCK, NVFP4, RAW, HASH} <= kinds
