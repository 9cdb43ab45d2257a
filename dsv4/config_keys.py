"""Which keys of an HF / transformers ``config.json`` are known, and what happens to each.

Every key is one of:

* **interpreted** (``MODEL_KEYS``): read into ``DSV4Config``;
* **fixed** (``FIXED``): a key whose value would change the model; only DeepSeek-V4's value is
  accepted, any other is refused with the reason (``mlp_bias: true`` adds biases the model has not);
* **harmless** (``TRAINING_KEYS``, ``ENGINE_KEYS``): true of the class that wrote the file (transformers'
  training/output switches) or of an engine (vLLM/SGLang DSpark knobs), not of the eval forward;
  known, no error, and recorded in ``DSV4Config.ignored_keys``, which every run's provenance carries;
* **file metadata** (``HF_META_KEYS``): what every HF config says about the file (architectures,
  transformers_version, dtype, ...); known, not recorded;
* **unknown**: an error naming it (today's example: the 0731 ``dspark_*`` keys, which an older
  reader dropped without a word). ``DSV4_ALLOW_UNKNOWN_CONFIG_KEYS=1`` (or ``allow_unknown=True``)
  proceeds and records them in ``ignored_keys``.

The transformers key set is that of transformers 5.23's ``DeepseekV4Config`` (``to_dict()`` and
``save_pretrained``); ``tests/dsv4/test_config_keys.py`` reads it from transformers itself.
Compute-free: the reference may import it.
"""
from __future__ import annotations

import os
from typing import Any, Mapping


class ConfigError(ValueError):
    """An invalid or inconsistent configuration; the message names the key, expected and found."""


# the transformers-5.x form's names of the three attention layer kinds
TF_LAYER_TYPE = {"window": "sliding_attention", "csa": "compressed_sparse_attention",
                 "hca": "heavily_compressed_attention"}
TF_LAYER_TYPE_INV = {v: k for k, v in TF_LAYER_TYPE.items()}

ALLOW_ENV = "DSV4_ALLOW_UNKNOWN_CONFIG_KEYS"

# Model keys the readers interpret (HF form a and transformers form b; spec dsv4-architecture.md §1).
MODEL_KEYS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "index_n_heads", "index_head_dim",
    "index_topk", "sliding_window", "compress_ratios", "compress_rates", "compress_rope_theta", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "max_position_embeddings", "hc_mult",
    "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "moe_intermediate_size", "num_hash_layers", "scoring_func", "routed_scaling_factor", "swiglu_limit",
    "num_nextn_predict_layers", "bos_token_id", "eos_token_id", "expert_dtype", "quantization_config",
    "layer_types", "mlp_layer_types",
    # DSpark (dspark.md §2.1)
    "dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank",
})

# Keys whose value would change the model: DeepSeek-V4's value (spec §1.1 table), and why another
# value is refused. A missing key means the DeepSeek-V4 value.
FIXED: dict[str, tuple[Any, str]] = {
    "model_type": ("deepseek_v4", "another architecture (deepseek_v41 adds Engram and vision towers)"),
    "hidden_act": ("silu", "the experts' SwiGLU gate is SiLU; another activation is another model"),
    "mlp_bias": (False, "a bias on every expert and shared-expert projection; DeepSeek-V4 has none and the "
                        "readers would drop them"),
    "attention_bias": (False, "a bias on the attention projections; DeepSeek-V4 has none"),
    "tie_word_embeddings": (False, "head tied to the embedding; DeepSeek-V4 stores its own head"),
    "norm_topk_prob": (True, "un-normalized top-k weights; sqrtsoftplus routing always renormalizes"),
    "topk_method": ("noaux_tc", "another expert selection than bias-corrected top-k"),
    "is_encoder_decoder": (False, "an encoder-decoder model"),
}

# transformers' training / output switches (DeepseekV4Config, PretrainedConfig): they change the loss
# or what forward returns, never the logits of an eval forward (router_jitter_noise is not read by
# 5.23's modeling code; dropout is off in eval; chunked feed-forward is the same math).
TRAINING_KEYS = frozenset({
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "attention_dropout",
    "chunk_size_feed_forward", "initializer_range", "use_cache", "output_hidden_states", "output_attentions",
    "return_dict", "id2label", "label2id", "problem_type", "pretraining_tp", "pad_token_id",
})

# Keys that describe the file, not the model.
HF_META_KEYS = frozenset({
    "architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype", "auto_map",
})

# Engine-only keys read by vLLM / SGLang for the DSpark drafter (dspark.md §2.2): not model facts.
ENGINE_KEYS = frozenset({
    "n_mtp_layers", "enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor",
    "dspark_draft_topk", "draft_vocab_size",
})

KNOWN_KEYS = MODEL_KEYS | set(FIXED) | TRAINING_KEYS | HF_META_KEYS | ENGINE_KEYS


def allow_unknown_default() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def check_fixed(d: Mapping[str, Any], name: str, error: type[Exception]) -> None:
    """Refuse a value of a FIXED key other than DeepSeek-V4's, naming the key, both values and why."""
    for key, (want, why) in FIXED.items():
        if key in d and d[key] is not None and d[key] != want:
            raise error(f"config '{name}': {key}: expected {want!r} (DeepSeek-V4), found {d[key]!r}: {why}")


def screen_hf_keys(d: Mapping[str, Any], name: str, allow_unknown: bool | None,
                   error: type[Exception]) -> tuple[str, ...]:
    """Check fixed values, raise ``error`` naming unknown keys (unless allowed); return the keys that
    will be ignored (harmless ones and, on opt-in, unknown ones) for the provenance."""
    check_fixed(d, name, error)
    unknown = sorted(set(d) - KNOWN_KEYS)
    allow = allow_unknown_default() if allow_unknown is None else allow_unknown
    if unknown and not allow:
        raise error(f"config '{name}': unexpected keys {unknown}: expected only DeepSeek-V4 keys (an unknown key "
                    f"may change the model); set {ALLOW_ENV}=1 to proceed without them (they are recorded in "
                    f"the run's provenance)")
    return tuple(sorted(set(unknown) | (set(d) & (ENGINE_KEYS | TRAINING_KEYS))))


# What transformers 5.23 writes beside the model keys (save_pretrained of DeepseekV4ForCausalLM): the
# synthetic writer adds it to its transformers-named layouts so they carry the same keys as a real
# save (tests/dsv4/test_config_keys.py checks it against transformers itself).
TRANSFORMERS_SAVED_EXTRAS: dict[str, Any] = {
    "attention_dropout": 0.0, "initializer_range": 0.02, "mlp_bias": False, "output_router_logits": False,
    "pad_token_id": None, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "use_cache": True,
    "transformers_version": "5.23.0",
}
