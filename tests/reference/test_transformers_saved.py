"""A checkpoint written by transformers 5.23 itself (``DeepseekV4ForCausalLM.save_pretrained``: its
config.json with every key the class writes, its reverse-renamed tensor names) opens unchanged in the
reference and the native model, and both agree with transformers' own FP32 forward on the logits."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import dsv4
import reference
from dsv4.checkpoint import open_checkpoint
from dsv4.config import preset

from .tf_tiny import redraw

transformers = pytest.importorskip("transformers")
T = 64


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
    from transformers.utils import logging as hf_logging

    from dsv4.tokenizer import build_tiny_tokenizer, write_tokenizer

    cfg = preset("tiny")
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()   # tiny max_position vs YaRN's original length: a harmless warning
    try:
        torch.manual_seed(0)
        tf = DeepseekV4ForCausalLM(DeepseekV4Config(**cfg.to_transformers_dict())).float().eval()
        redraw(tf, cfg.index_n_heads, cfg.hc_mult, cfg.n_routed_experts)
        out = tmp_path_factory.mktemp("tf-saved")
        tf.save_pretrained(out)
    finally:
        hf_logging.set_verbosity(level)
    write_tokenizer(build_tiny_tokenizer(vocab_size=cfg.vocab_size, fill=True), out)
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        tf_logits = tf(ids[None], use_cache=False).logits[0].float()
    return out, ids, tf_logits


def test_the_saved_config_carries_transformers_keys_and_opens(saved) -> None:
    out, _, _ = saved
    d = json.loads((out / "config.json").read_text())
    # the keys the strict reader once refused are there, and are recorded as ignored, not errors
    assert {"mlp_bias", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise"} <= set(d)
    r = open_checkpoint(out)
    assert r.flavor == "transformers-saved"
    assert {"output_router_logits", "router_aux_loss_coef", "router_jitter_noise"} <= set(r.config.ignored_keys)
    assert r.config.replace(name="tiny", dtype="fp8", expert_dtype="fp4") == preset("tiny")
    assert r.weight("attn.kv_norm", 0).names["weight"] == "model.layers.0.attn.norm.weight"


def test_a_model_changing_value_is_refused_with_its_reason(saved, tmp_path) -> None:
    out, _, _ = saved
    d = json.loads((out / "config.json").read_text())
    with pytest.raises(dsv4.config.ConfigError, match=r"mlp_bias: expected False .* found True: a bias"):
        dsv4.config.DSV4Config.from_dict(dict(d, mlp_bias=True))


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    cos = F.cosine_similarity(a, b, dim=-1)
    assert cos.min() >= 0.9999, cos.min()
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_reference_logits_match_transformers(saved) -> None:
    out, ids, tf_logits = saved
    ref = reference.load_model(str(out), profile="bf16", dtype=torch.float32)
    with torch.no_grad():
        _close(ref(ids).float(), tf_logits)


def test_native_logits_match_transformers(saved) -> None:
    out, ids, tf_logits = saved
    nat = dsv4.load_model(str(out), plan="all-fp32", backend="emulated")
    with torch.no_grad():
        _close(nat(ids).float(), tf_logits)
