"""Reader: round trips synth -> reader for every flavor, lazy loading, fingerprint, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from dsv4.checkpoint import CheckpointError, open_checkpoint
from dsv4.checkpoint.synth import build_tensors
from dsv4.config import preset

TINY = preset("tiny")


@pytest.fixture(scope="module")
def nv_tensors():
    return build_tensors(TINY, "nvidia-nvfp4")


def write(d: Path, tensors: dict, config: dict | None = None, flavor: str = "nvidia-nvfp4") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else (TINY.to_transformers_dict() if flavor == "hf" else TINY.to_hf_dict())
    (d / "config.json").write_text(json.dumps(cfg))
    save_file(dict(tensors), str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("flavor,quant,expert_kind,attn_kind", [
    ("official", "bf16", "mxfp4", "fp8_block"),
    ("nvidia-nvfp4", "bf16", "nvfp4", "fp8_block"),
    ("hf", "bf16", "dense", "dense"),
    ("hf", "fp8", "fp8_block", "fp8_block"),
    ("hf", "nvfp4", "nvfp4", "dense"),
])
def test_synth_round_trip(tmp_path, flavor, quant, expert_kind, attn_kind):
    write(tmp_path, build_tensors(TINY, flavor, quant), flavor=flavor)
    r = open_checkpoint(tmp_path)
    assert r.flavor == flavor
    assert r.config.replace(name="tiny", dtype=TINY.dtype, expert_dtype=TINY.expert_dtype) == TINY
    assert r.weight_format("ffn.experts.5.w2", 3).kind == expert_kind
    assert r.weight_format("attn.wq_b", 2).kind == attn_kind
    w = r.weight("ffn.experts.5.w1", 3)
    n, k = TINY.moe_intermediate_size, TINY.hidden_size
    assert w.tensors["weight"].shape[0] == n and w.fmt.shape == (n, k)
    assert set(r.weight_names(1)) >= {"attn.indexer.wq_b", "attn.compressor.ape", "ffn.gate.tid2eid"}
    assert "ffn.gate.bias" in r.weight_names(2) and "ffn.gate.tid2eid" not in r.weight_names(2)
    assert "attn.compressor.wkv" not in r.weight_names(0)   # window-only layer
    assert r.has_mtp == (flavor != "hf")


def test_hf_fused_experts_slice_w1_then_w3(tmp_path):
    t = build_tensors(TINY, "hf", "bf16")
    write(tmp_path, t, flavor="hf")
    r = open_checkpoint(tmp_path)
    fused = t["model.layers.2.mlp.experts.gate_up_proj"]
    I = TINY.moe_intermediate_size
    assert torch.equal(r.weight("ffn.experts.6.w1", 2).tensors["weight"], fused[6, :I])
    assert torch.equal(r.weight("ffn.experts.6.w3", 2).tensors["weight"], fused[6, I:])
    assert torch.equal(r.weight("ffn.experts.6.w2", 2).tensors["weight"],
                       t["model.layers.2.mlp.experts.down_proj"][6])


def test_nvfp4_experts_share_w13_global_scale(nv_tensors):
    for e in range(TINY.n_routed_experts):
        g1 = nv_tensors[f"layers.3.ffn.experts.{e}.w1.weight_scale_2"]
        g3 = nv_tensors[f"layers.3.ffn.experts.{e}.w3.weight_scale_2"]
        assert torch.equal(g1, g3)


def test_mtp_experts_stay_mxfp4(nv_tensors):
    assert nv_tensors["mtp.0.ffn.experts.0.w1.weight"].dtype == torch.int8
    assert "mtp.0.ffn.experts.0.w1.weight_scale_2" not in nv_tensors


def test_model_prefix_official_names_accepted(tmp_path, nv_tensors):
    write(tmp_path, {"model." + k: v for k, v in nv_tensors.items()})
    r = open_checkpoint(tmp_path)
    assert r.flavor == "nvidia-nvfp4"
    assert r.weight("attn.attn_sink", 1).names["weight"] == "model.layers.1.attn.attn_sink"


def test_sharded_checkpoint_and_index(tmp_path):
    from dsv4.checkpoint.synth import write_checkpoint

    write_checkpoint(tmp_path, TINY, build_tensors(TINY, "official"), "official", shard_bytes=1 << 20)
    idx = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) > 2
    r = open_checkpoint(tmp_path)
    assert r.weight("embed").tensors["weight"].shape == (TINY.vocab_size, TINY.hidden_size)
    assert len(r.fingerprint()) == 64


def test_lazy_nothing_read_until_asked(tmp_path, nv_tensors, monkeypatch):
    write(tmp_path, nv_tensors)
    calls = []
    import safetensors

    real = safetensors.safe_open

    def spy(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr("dsv4.checkpoint.reader.safe_open", spy)
    r = open_checkpoint(tmp_path)
    assert calls == []            # open parses headers only
    r.weight("norm")
    assert len(calls) == 1


def test_fingerprint_tracks_config_and_headers(tmp_path, nv_tensors):
    a = open_checkpoint(write(tmp_path / "a", nv_tensors)).fingerprint()
    assert open_checkpoint(write(tmp_path / "same", nv_tensors)).fingerprint() == a
    # headers, not values, are hashed (cheap for 1.6 TB): a changed dtype or config shows up
    t2 = _set(nv_tensors, "layers.0.ffn.gate.tid2eid", nv_tensors["layers.0.ffn.gate.tid2eid"].int())
    assert open_checkpoint(write(tmp_path / "dtype", t2)).fingerprint() != a
    cfg = TINY.to_hf_dict()
    cfg["rope_theta"] = 20000.0
    assert open_checkpoint(write(tmp_path / "cfg", nv_tensors, cfg)).fingerprint() != a


# ---- bad input: one CheckpointError naming the tensor or key, expected and found --------------------
def _drop(t, name):
    t = dict(t)
    del t[name]
    return t


def _set(t, name, value):
    t = dict(t)
    t[name] = value
    return t


BAD = {
    "missing tensor": (lambda t: _drop(t, "layers.2.attn.wq_b.weight"), "layers.2.attn.wq_b.weight"),
    "unexpected tensor": (lambda t: _set(t, "layers.1.attn.bogus.weight", torch.zeros(2)), "bogus"),
    "wrong shape": (lambda t: _set(t, "layers.0.attn.q_norm.weight", torch.zeros(64, dtype=torch.bfloat16)),
                    r"q_norm.*expected \[128\].*found \[64\]"),
    "wrong dtype": (lambda t: _set(t, "layers.0.attn.attn_sink", torch.zeros(4, dtype=torch.int32)),
                    r"attn_sink.*dtype"),
    "scale of wrong size": (lambda t: _set(t, "layers.1.attn.wq_a.scale", t["layers.1.attn.wq_a.scale"][:, :1]),
                            r"wq_a.scale.*expected \[1, 2\].*found \[1, 1\]"),
    "nvfp4 scale of wrong size": (
        lambda t: _set(t, "layers.3.ffn.experts.2.w2.weight_scale",
                       t["layers.3.ffn.experts.2.w2.weight_scale"][:, :4].contiguous()),
        r"experts.2.w2.weight_scale.*expected \[256, 8\]"),
    "packed weight of wrong width": (
        lambda t: _set(t, "layers.3.ffn.experts.0.w1.weight", torch.zeros(128, 64, dtype=torch.uint8)),
        r"experts.0.w1.weight.*expected \[128, 128\]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_tensors(tmp_path, nv_tensors, case):
    mutate, needle = BAD[case]
    write(tmp_path, mutate(nv_tensors))
    with pytest.raises(CheckpointError, match=needle):
        open_checkpoint(tmp_path)


def test_config_disagrees_expert_and_layer_count(tmp_path, nv_tensors):
    write(tmp_path / "e", nv_tensors, TINY.replace(n_routed_experts=4).to_hf_dict())
    with pytest.raises(CheckpointError, match=r"n_routed_experts=4, tensors hold experts 0..7"):
        open_checkpoint(tmp_path / "e")
    small = TINY.replace(num_hidden_layers=3, compress_ratios=(0, 4, 16))
    write(tmp_path / "l", nv_tensors, small.to_hf_dict())
    with pytest.raises(CheckpointError, match=r"num_hidden_layers=3, tensors hold layers 0..3"):
        open_checkpoint(tmp_path / "l")
    write(tmp_path / "m", nv_tensors, TINY.replace(n_routed_experts=16).to_hf_dict())
    with pytest.raises(CheckpointError, match=r"n_routed_experts=16, tensors hold experts 0..7"):
        open_checkpoint(tmp_path / "m")


def test_truncated_shard(tmp_path, nv_tensors):
    d = write(tmp_path, nv_tensors)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated"):
        open_checkpoint(d)
    f.write_bytes(data[:4])
    with pytest.raises(CheckpointError, match="header length"):
        open_checkpoint(d)


def test_index_names_missing_shard(tmp_path, nv_tensors):
    d = write(tmp_path, nv_tensors)
    wm = {k: "model-00001-of-00002.safetensors" for k in nv_tensors}
    wm["norm.weight"] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CheckpointError, match=r"model-0000[12]-of-00002.*do not exist"):
        open_checkpoint(d)


def test_invalid_config_json(tmp_path, nv_tensors):
    d = write(tmp_path, nv_tensors)
    (d / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="config.json"):
        open_checkpoint(d)
    cfg = TINY.to_hf_dict()
    del cfg["moe_intermediate_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="moe_intermediate_size"):
        open_checkpoint(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        open_checkpoint(d)
    assert open_checkpoint(d, config=TINY).config is TINY   # config= replaces a missing config.json


def test_unknown_weight_name_is_clear(tmp_path, nv_tensors):
    r = open_checkpoint(write(tmp_path, nv_tensors))
    with pytest.raises(CheckpointError, match="attn.wq_c"):
        r.weight("attn.wq_c", 0)
    with pytest.raises(CheckpointError, match="no-such-tensor"):
        r.get_tensor("no-such-tensor")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="found none"):
        open_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="found nothing"):
        open_checkpoint(tmp_path / "absent")
