"""Which keys of an HF / transformers ``config.json`` are known, and what happens to the others.

A key we do not know can change the model (today's example: the 0731 ``dspark_*`` keys, which an
older reader dropped without a word), so an unknown key is an error naming it. The explicit opt-in
``DSV4_ALLOW_UNKNOWN_CONFIG_KEYS=1`` (or ``allow_unknown=True``) proceeds and records the ignored
keys in the config (``DSV4Config.ignored_keys``), which every run's provenance carries.
Compute-free: the reference may import it.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

ALLOW_ENV = "DSV4_ALLOW_UNKNOWN_CONFIG_KEYS"

# Model keys the readers interpret (HF form a and transformers form b; spec dsv4-architecture.md §1).
MODEL_KEYS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "index_n_heads", "index_head_dim",
    "index_topk", "sliding_window", "compress_ratios", "compress_rates", "compress_rope_theta", "rope_theta",
    "rope_scaling", "rope_parameters", "partial_rotary_factor", "max_position_embeddings", "hc_mult",
    "hc_sinkhorn_iters", "hc_eps", "rms_norm_eps", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
    "moe_intermediate_size", "num_hash_layers", "scoring_func", "topk_method", "norm_topk_prob",
    "routed_scaling_factor", "swiglu_limit", "hidden_act", "num_nextn_predict_layers", "tie_word_embeddings",
    "bos_token_id", "eos_token_id", "attention_bias", "expert_dtype", "quantization_config", "layer_types",
    "mlp_layer_types",
    # DSpark (dspark.md §2.1)
    "dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank",
})

# Keys that are true of every HF config and say nothing about this model's math.
HF_META_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "pad_token_id", "auto_map", "attention_dropout", "output_hidden_states",
    "output_attentions", "return_dict", "pretraining_tp",
})

# Engine-only keys read by vLLM / SGLang for the DSpark drafter (dspark.md §2.2): not model facts.
# Known, so no error; recorded as ignored so the provenance shows they were present.
ENGINE_KEYS = frozenset({
    "n_mtp_layers", "enable_confidence_head", "confidence_head_with_markov", "sample_from_anchor",
    "dspark_draft_topk", "draft_vocab_size",
})


def allow_unknown_default() -> bool:
    return os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def screen_hf_keys(d: Mapping[str, Any], name: str, allow_unknown: bool | None,
                   error: type[Exception]) -> tuple[str, ...]:
    """Raise ``error`` naming unknown keys (unless allowed); return the keys that will be ignored."""
    unknown = sorted(set(d) - MODEL_KEYS - HF_META_KEYS - ENGINE_KEYS)
    allow = allow_unknown_default() if allow_unknown is None else allow_unknown
    if unknown and not allow:
        raise error(f"config '{name}': unexpected keys {unknown}: expected only DeepSeek-V4 keys (an unknown key "
                    f"may change the model); set {ALLOW_ENV}=1 to proceed without them (they are recorded in "
                    f"the run's provenance)")
    return tuple(sorted(set(unknown) | (set(d) & ENGINE_KEYS)))
