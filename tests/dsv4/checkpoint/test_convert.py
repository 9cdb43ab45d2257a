"""The layout converter and the streaming checkpoint writer it shares with the synthetic one."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.convert import convert
from dsv4.checkpoint.synth import _e2m1_codes, _E2M1_MIDPOINTS, _E2M1_VALUES, build_tensors, iter_tensors, synth
from dsv4.config import preset
from dsv4.weights import dequantize


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.element_size() == 1:
        a, b = a.view(torch.uint8), b.view(torch.uint8)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_streamed_shards_hold_the_same_tensors_as_the_mapping(tmp_path: Path) -> None:
    c = preset("tiny")
    out = synth("tiny", "official", tmp_path / "s", shard_bytes=1 << 20)
    files = sorted(out.glob("model-*.safetensors"))
    assert len(files) > 3 and not list(out.glob(".*partial"))
    want = build_tensors(c, "official")
    r = open_checkpoint(out)
    assert set(r.tensor_names()) == set(want)
    assert all(_same(r.get_tensor(n), t) for n, t in want.items())
    mask = os.umask(0)
    os.umask(mask)
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask for f in files)   # not safetensors' 0600


def test_iter_tensors_equals_build_tensors_with_shared_nvfp4_globals() -> None:
    c = preset("tiny")
    streamed = dict(iter_tensors(c, "nvidia-nvfp4", workers=2))
    whole = build_tensors(c, "nvidia-nvfp4")
    assert streamed.keys() == whole.keys() and all(_same(streamed[k], whole[k]) for k in whole)
    g1 = streamed["layers.2.ffn.experts.3.w1.weight_scale_2"]
    assert torch.equal(g1, streamed["layers.2.ffn.experts.3.w3.weight_scale_2"])   # w1/w3 share (spec §2.4)


def test_e2m1_rounding_is_nearest_with_ties_to_even() -> None:
    grid = np.asarray(_E2M1_VALUES)
    v = np.concatenate([np.linspace(-7, 7, 20001), _E2M1_MIDPOINTS, np.negative(_E2M1_MIDPOINTS)]).astype(np.float32)
    codes = _e2m1_codes(v)
    mag = grid[codes & 7]
    err = np.abs(np.minimum(np.abs(v), 6.0) - mag)
    best = np.min(np.abs(np.minimum(np.abs(v), 6.0)[:, None] - grid[None, :]), axis=1)
    assert np.array_equal(err, best)                       # nearest
    tie = np.isin(np.abs(v), _E2M1_MIDPOINTS)
    assert bool(((codes[tie] & 7) % 2 == 0).all())         # ties to the even code
    assert bool(((codes >> 3)[(v < 0) & (mag > 0)] == 1).all()) and not bool((codes[v >= 0] >> 3).any())


def test_convert_official_to_nvfp4_keeps_fp8_bit_exact_and_requantizes_experts(tmp_path: Path) -> None:
    src = synth("tiny", "official", tmp_path / "src")
    dst = convert(src, "nvidia-nvfp4", tmp_path / "dst")
    a, b = open_checkpoint(src), open_checkpoint(dst)
    assert b.flavor == "nvidia-nvfp4" and b.config.vocab_size == a.config.vocab_size
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    fa, fb = a.weight("attn.wq_a", 1), b.weight("attn.wq_a", 1)
    assert fa.fmt.kind == fb.fmt.kind == "fp8_block" and all(_same(fa.tensors[r], fb.tensors[r]) for r in fa.tensors)
    ea, eb = a.weight("ffn.experts.3.w2", 2), b.weight("ffn.experts.3.w2", 2)
    assert (ea.fmt.kind, eb.fmt.kind) == ("mxfp4", "nvfp4")
    wa, wb = dequantize(ea), dequantize(eb)
    assert float((wa - wb).norm() / wa.norm()) < 0.1        # one FP4 requantization, not another weight
    assert torch.equal(a.weight("ffn.gate.tid2eid", 0).tensors["weight"], b.weight("ffn.gate.tid2eid", 0).tensors["weight"])


def test_convert_official_to_compressed_tensors_is_the_published_form(tmp_path: Path) -> None:
    """FP8-block attention keeps its codes (scales as F32 powers of two), experts become NVFP4, shared
    experts and the draft BF16 (exact upcasts of FP8 / MXFP4), the draft's embed / head copies the trunk's."""
    src = synth("tiny", "official", tmp_path / "src")
    dst = convert(src, "compressed-tensors", tmp_path / "dst")
    a, b = open_checkpoint(src), open_checkpoint(dst)
    assert b.flavor == "compressed-tensors" and b.has_mtp
    fa, fb = a.weight("attn.wo_b", 3), b.weight("attn.wo_b", 3)
    assert (fb.fmt.kind, fb.fmt.scale_dtype, fb.names["scale"]) == \
        ("fp8_block", "F32", "layers.3.attn.wo_b.weight_scale")
    assert _same(fa.tensors["weight"], fb.tensors["weight"]) and torch.equal(dequantize(fa), dequantize(fb))
    assert b.weight_format("ffn.experts.3.w2", 2).kind == "nvfp4"
    for name, layer in (("ffn.shared_experts.w1", 1), ("mtp.0.ffn.experts.1.w2", None), ("mtp.0.e_proj", None)):
        wa, wb = a.weight(name, layer), b.weight(name, layer)
        assert wb.fmt.kind == "dense" and torch.equal(dequantize(wa).bfloat16(), wb.tensors["weight"]), name
    assert torch.equal(b.get_tensor("mtp.0.head.weight"), a.get_tensor("head.weight"))


def test_convert_cli_refuses_a_non_empty_output(tmp_path: Path) -> None:
    src = synth("tiny", "official", tmp_path / "src")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("keep me")
    r = subprocess.run([sys.executable, "-m", "dsv4.checkpoint.convert", str(src), "--flavor", "nvidia-nvfp4",
                        "--out", str(tmp_path / "busy")], capture_output=True, text=True)
    assert r.returncode == 2 and "empty directory" in r.stderr and (tmp_path / "busy" / "x").read_text() == "keep me"
    r = subprocess.run([sys.executable, "-m", "dsv4.checkpoint.convert", str(tmp_path / "nope"), "--flavor",
                        "official", "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
