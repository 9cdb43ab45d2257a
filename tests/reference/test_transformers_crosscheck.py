"""Independent cross-check against transformers 5.23.0's DeepseekV4ForCausalLM (spec source TF).

The tiny preset is built in transformers (fp32), its parameters re-drawn with a seeded generator
(the library's init zeroes sinks, biases and position biases, which would hide their handling),
saved as an `hf`-flavor checkpoint and read back by the reference (bf16 profile, fp32 activations).
The prompt (64 tokens) gives the CSA layers 16 entries for index_topk = 4 and the HCA layer 4.

Known differences (§16) are settled by configuration: fp32 everywhere removes TF's bf16 islands
(items 3, 14); the bf16 profile has no Hadamard / fake quantization (item 2). The indexer's ReLU
makes exact-zero scores frequent with 4 heads and the spec leaves the order of tied top-k entries
open: the indexer query heads are drawn in ± pairs, which excludes exact zeros (not a loosened bound).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import reference
from dsv4 import probes
from dsv4.config import preset
from reference.rope import cos_sin, rope_spec

transformers = pytest.importorskip("transformers")
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

T = 64


def redraw(model: torch.nn.Module, n_heads_idx: int, n: int, n_experts: int, seed: int = 1234) -> None:
    """Sensible, seeded scales: unit-RMS linears (gain 6 on expert gate/up so SwiGLU inputs pass the
    limit), norms near 1, sinks ~ the scores, non-trivial biases, ape and hash tables."""
    g = torch.Generator().manual_seed(seed)

    def rn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            leaf = name.rsplit(".", 1)[-1]
            if "rotary" in name:
                continue
            if leaf == "tid2eid":
                p.copy_(torch.argsort(torch.rand(p.shape[0], n_experts, generator=g), 1)[:, :p.shape[1]])
            elif leaf == "e_score_correction_bias":
                p.copy_(0.3 * rn(*p.shape))
            elif leaf == "sinks":
                p.copy_(1.0 + rn(*p.shape))
            elif leaf == "position_bias":
                p.copy_(rn(*p.shape))
            elif leaf in ("fn", "hc_fn"):
                p.copy_(rn(*p.shape) / math.sqrt(p.shape[1]))
            elif leaf in ("scale", "hc_scale"):
                p.copy_(0.3 + 0.3 * torch.rand(*p.shape, generator=g))
            elif leaf in ("base", "hc_base"):
                b = 0.5 * rn(*p.shape)
                if p.shape[0] == (2 + n) * n:      # comb part leans to the identity, as in synth
                    b[2 * n:] += 2.0 * torch.eye(n).reshape(-1)
                p.copy_(b)
            elif leaf == "gate_up_proj":
                p.copy_(rn(*p.shape) * 6.0 / math.sqrt(p.shape[2]))
            elif leaf == "down_proj":
                p.copy_(rn(*p.shape) / math.sqrt(p.shape[2]))
            elif name == "model.embed_tokens.weight":
                p.copy_(rn(*p.shape))
            elif p.dim() == 1:
                p.copy_(1.0 + 0.1 * rn(*p.shape))
            elif p.dim() == 2:
                gain = 3.0 if name == "lm_head.weight" else 1.0
                if "shared_experts" in name and "down_proj" not in name:
                    gain = 6.0
                p.copy_(rn(*p.shape) * gain / math.sqrt(p.shape[1]))
            else:
                raise AssertionError(f"no draw for {name} {tuple(p.shape)}")
        for name, p in model.named_parameters():
            if name.endswith("indexer.q_b_proj.weight"):   # heads h and h + Hi/2 opposite: no 0-score ties
                w = p.view(n_heads_idx, -1, p.shape[1])
                w[n_heads_idx // 2:] = -w[: n_heads_idx // 2]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple:
    from safetensors.torch import save_file

    cfg = preset("tiny")
    d = cfg.to_transformers_dict()
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()     # tiny max_position vs YaRN's original length: a harmless warning
    try:
        torch.manual_seed(0)
        tf = DeepseekV4ForCausalLM(DeepseekV4Config(**d)).float().eval()
    finally:
        hf_logging.set_verbosity(level)
    redraw(tf, cfg.index_n_heads, cfg.hc_mult, cfg.n_routed_experts)
    out: Path = tmp_path_factory.mktemp("tf-tiny")
    save_file({k: v.contiguous() for k, v in tf.state_dict().items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(d))
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=torch.Generator().manual_seed(99))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            res = tf(ids[None], use_cache=False, output_hidden_states=True)
        ref = reference.load_model(str(out), profile="bf16", dtype=torch.float32)
        with probes.ProbeRecorder() as rec:
            logits = ref(ids)
    finally:
        torch.set_num_threads(threads)
    return tf, res, ref, rec, logits


def test_logits_match_transformers(pair) -> None:
    _, res, ref, rec, logits = pair
    tf_logits = res.logits[0].float()
    cos = F.cosine_similarity(logits, tf_logits, dim=-1)
    assert ref.reader.flavor == "hf"
    assert cos.min() >= 0.9999, cos.min()
    assert torch.equal(logits.argmax(-1), tf_logits.argmax(-1))
    # the prompt exercises what it should: CSA selects fewer entries than are visible, HCA has >= 2
    c = ref.config
    topk = rec["layers.1.attn.indexer.topk"]
    visible = (torch.arange(T) + 1) // c.csa_ratio
    assert bool(((topk >= 0).sum(-1) < visible).any()) and T // c.hca_ratio >= 2


def test_every_layer_output_matches(pair) -> None:
    """Layer outputs, also with the stream mean removed (the part mHC's comb mixing shapes)."""
    _, res, ref, rec, _ = pair
    for i in range(ref.config.num_hidden_layers - 1):   # transformers' last entry is after the final norm
        a, b = rec[f"layers.{i}.out"], res.hidden_states[i + 1][0]
        assert F.cosine_similarity(a.flatten(1), b.flatten(1), dim=-1).min() >= 0.9999, i
        a, b = a - a.mean(1, keepdim=True), b - b.mean(1, keepdim=True)
        assert F.cosine_similarity(a.flatten(1), b.flatten(1), dim=-1).min() >= 0.9999, i


def test_rope_tables_match_transformers(pair) -> None:
    """cos/sin of both rope types (§11) at every position up to max_position_embeddings."""
    tf = pair[0]
    c = preset("tiny")
    pos = torch.arange(c.max_position_embeddings)
    x = torch.zeros(1, dtype=torch.float32)
    for kind, tf_type in (("window", "main"), ("csa", "compress")):
        tf_cos, tf_sin = tf.model.rotary_emb(x, pos[None], layer_type=tf_type)
        cos, sin = cos_sin(rope_spec(c, kind), pos)
        assert torch.allclose(cos, tf_cos[0], atol=1e-6) and torch.allclose(sin, tf_sin[0], atol=1e-6), kind
    assert not torch.allclose(cos_sin(rope_spec(c, "window"), pos)[0], cos_sin(rope_spec(c, "csa"), pos)[0])
