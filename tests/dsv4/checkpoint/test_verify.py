"""The value scan: every tensor, used or not; each impossible value named with its tensor and index."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.synth import build_tensors
from dsv4.checkpoint.verify import main as verify_main, scan_values
from dsv4.config import preset

TINY = preset("tiny")


def _write(path, tensors):
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    return path


def _bytes_set(t, index, value):
    b = t.view(torch.uint8).clone()
    b.view(-1)[index] = value
    return b.view(t.dtype)


CASES = {
    # an expert no prompt may select, an MTP weight nothing runs, a norm: all scanned
    "nan-norm": ("layers.1.attn_norm.weight", lambda t: t.index_fill(0, torch.tensor([3]), float("nan")),
                 "not finite"),
    "e8m0-255-mtp": ("mtp.0.ffn.experts.5.w2.scale", lambda t: _bytes_set(t, 7, 255), "E8M0 scale code 255"),
    "fp8-nan": ("layers.2.attn.wq_b.weight", lambda t: _bytes_set(t, 11, 0x7F), "E4M3 NaN"),
    "inf-global": ("layers.3.ffn.experts.7.w1.weight_scale_2", lambda t: torch.full_like(t, float("inf")),
                   "not finite"),
    "zero-input-scale": ("layers.3.ffn.experts.7.w3.input_scale", lambda t: torch.zeros_like(t), "not positive"),
    "neg-block-scale": ("layers.2.ffn.experts.1.w2.weight_scale", lambda t: _bytes_set(t, 0, 0xB8),
                        "negative E4M3 block scale"),
    "bad-hash-id": ("layers.0.ffn.gate.tid2eid", lambda t: t.index_fill(0, torch.tensor([9]), 99),
                    "expert id outside"),
}


@pytest.fixture(scope="module")
def clean():
    return build_tensors(TINY, "nvidia-nvfp4")


def test_clean_checkpoint_has_no_findings(tmp_path, clean):
    assert scan_values(open_checkpoint(_write(tmp_path / "ok", clean))) == []


@pytest.mark.parametrize("case", list(CASES))
def test_each_bad_value_is_named(tmp_path, clean, case, capsys):
    name, make, what = CASES[case]
    t = dict(clean)
    t[name] = make(t[name])
    ck = _write(tmp_path / case, t)
    f = scan_values(open_checkpoint(ck))
    assert len(f) == 1 and f[0].tensor == name and what in f[0].what
    assert verify_main([str(ck)]) == 2
    assert name in capsys.readouterr().out


def test_first_token_refuses_bad_values_before_compute(tmp_path, clean, capsys):
    from dsv4.checkpoint.synth import resolve_preset
    from parity.first_token import main
    import shutil

    ck = tmp_path / "nan"
    shutil.copytree(resolve_preset("tiny"), ck)
    t = dict(clean)
    name, make, _ = CASES["e8m0-255-mtp"]
    t[name] = make(t[name])
    (ck / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in t.items()}, str(ck / "model.safetensors"))
    assert main(["--checkpoint", str(ck), "--mode", "chat", "--device", "cpu"]) == 2
    out = capsys.readouterr()
    assert name in (out.out + out.err).replace("\n", "")
