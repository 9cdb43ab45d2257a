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

import pytest
import torch
import torch.nn.functional as F

import reference
from dsv4 import probes
from dsv4.config import preset
from reference.rope import cos_sin, rope_spec

from .tf_tiny import build_tf_tiny

transformers = pytest.importorskip("transformers")

T = 64


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple:
    tf, out = build_tf_tiny(tmp_path_factory.mktemp("tf-tiny"))
    cfg = preset("tiny")
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
