"""Config parsing from the three forms (spec §1), presets, and validation errors."""
from __future__ import annotations

import json

import pytest

from dsv4.config import ConfigError, DSV4Config, check_token_ids, layer_devices, load_config, preset

OFFICIAL_FLASH = {  # spec §1.2 (OFF-IC), incl. the fork-added key that must be ignored
    "vocab_size": 129280, "dim": 4096, "moe_inter_dim": 2048, "n_layers": 43, "n_hash_layers": 3, "n_heads": 64,
    "n_routed_experts": 256, "n_shared_experts": 1, "n_activated_experts": 6, "score_func": "sqrtsoftplus",
    "route_scale": 1.5, "swiglu_limit": 10.0, "q_lora_rank": 1024, "head_dim": 512, "rope_head_dim": 64,
    "o_groups": 8, "o_lora_rank": 1024, "window_size": 128, "original_seq_len": 65536, "rope_theta": 10000,
    "rope_factor": 16, "beta_fast": 32, "beta_slow": 1, "index_n_heads": 64, "index_head_dim": 128,
    "index_topk": 512, "hc_mult": 4, "hc_sinkhorn_iters": 20, "dtype": "fp8", "scale_fmt": "ue8m0",
    "expert_dtype": "fp4", "compress_rope_theta": 160000, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "n_routed_experts_score": 256,
}


def test_flash_preset_matches_spec_table():
    c = preset("flash")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.q_lora_rank, c.o_groups) == (
        4096, 43, 64, 1024, 8)
    assert [c.layer_kind(i) for i in (0, 1, 2, 3, 42)] == ["window", "window", "csa", "hca", "csa"]
    assert c.routed_scaling_factor == 1.5 and c.n_routed_experts == 256 and c.index_topk == 512
    assert c.wo_a_group_in == 4096 and c.hc_mix_dim == 24


def test_pro_preset_matches_spec_table():
    c = preset("pro")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.q_lora_rank, c.o_groups) == (
        7168, 61, 128, 1536, 16)
    kinds = [c.layer_kind(i) for i in range(61)]
    assert kinds[:2] == ["hca", "hca"] and "window" not in kinds and kinds.count("csa") == 30
    assert c.routed_scaling_factor == 2.5 and c.wo_a_group_in == 4096


def test_official_form_equals_flash_preset():
    c = DSV4Config.from_dict(OFFICIAL_FLASH, name="flash")
    assert c == preset("flash")


@pytest.mark.parametrize("name", ["flash", "pro", "tiny", "tiny-deep"])
def test_hf_and_transformers_forms_round_trip(name):
    c = preset(name)
    assert DSV4Config.from_dict(c.to_hf_dict(), name=name) == c
    t = DSV4Config.from_dict(c.to_transformers_dict(), name=name)
    # the transformers form carries no storage dtypes (per-tensor in hf checkpoints)
    assert t.replace(dtype=c.dtype, expert_dtype=c.expert_dtype) == c


def test_transformers_library_accepts_our_form():
    transformers = pytest.importorskip("transformers")
    tc = transformers.DeepseekV4Config(**preset("tiny").to_transformers_dict())
    assert tc.layer_types == ["sliding_attention", "compressed_sparse_attention",
                              "heavily_compressed_attention", "compressed_sparse_attention"]
    assert tc.compress_rates["heavily_compressed_attention"] == 16 and tc.qk_rope_head_dim == 64
    assert tc.mlp_layer_types == ["hash_moe", "hash_moe", "moe", "moe"]


def test_hf_config_keeps_mtp_entry_separate():
    d = preset("flash").to_hf_dict()
    assert len(d["compress_ratios"]) == 44 and d["compress_ratios"][-1] == 0
    c = DSV4Config.from_dict(d)
    assert len(c.compress_ratios) == 43 and c.mtp_compress_ratios == (0,)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("hidden_size"), "hidden_size"),
    (lambda d: d.update(hidden_size="4096"), "hidden_size"),
    (lambda d: d.update(compress_ratios=[0, 4]), "compress_ratios"),
    (lambda d: d.update(compress_ratios=[0, 4, 16, 5, 0]), "compress_ratios"),
    (lambda d: d.update(num_key_value_heads=8), "num_key_value_heads"),
    (lambda d: d.update(o_groups=3), "o_groups"),
    (lambda d: d.update(scoring_func="softmax"), "scoring_func"),
    (lambda d: d.update(sliding_window=8), "sliding_window"),
])
def test_invalid_hf_config_names_the_key(mutate, needle):
    d = preset("tiny").to_hf_dict()
    mutate(d)
    with pytest.raises(ConfigError, match=needle):
        DSV4Config.from_dict(d)


def test_invalid_json_and_unknown_preset(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="valid JSON"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="preset"):
        load_config("no-such-preset")
    with pytest.raises(ConfigError, match="official"):
        DSV4Config.from_dict({"foo": 1})
    bad = dict(OFFICIAL_FLASH)
    bad["bogus_key"] = 1
    with pytest.raises(ConfigError, match="bogus_key"):
        DSV4Config.from_dict(bad)


def test_config_json_file_round_trip(tmp_path):
    c = preset("tiny")
    c.to_json(tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "deepseek_v4"
    assert load_config(tmp_path).replace(name="tiny") == c


def test_token_id_validation():
    import torch

    c = preset("tiny")
    check_token_ids(c, torch.tensor([0, 5, 511]))
    for ids, needle in [(torch.tensor([0, 512]), "512"), (torch.tensor([-1]), "-1"),
                        (torch.tensor([], dtype=torch.long), "empty"),
                        (torch.zeros(c.max_position_embeddings + 1, dtype=torch.long), "max_position"),
                        (torch.tensor([0.5]), "integer"), ([1, 2], "tensor")]:
        with pytest.raises(ValueError, match=needle):
            check_token_ids(c, ids)


def test_device_map_validation():
    c = preset("tiny")
    m = layer_devices(c, "cpu", {0: "cpu", "head": "cpu"})
    assert m == {"embed": "cpu", 0: "cpu", 1: "cpu", 2: "cpu", 3: "cpu", "head": "cpu"}
    with pytest.raises(ValueError, match="existing device"):
        layer_devices(c, "cpu", {1: "cuda:7"})
    with pytest.raises(ValueError, match="layer index"):
        layer_devices(c, "cpu", {9: "cpu"})
