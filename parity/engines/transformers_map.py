"""Which transformers module gives which probe (transformers' DeepseekV4 classes, checked on 5.23).

Data, one row per probe suffix: the module path under ``model.layers.{i}.`` (or the model root for
global probes), whether the probe is the module's output or its first input, and how the tensor is
laid out there. Probes not in the table are not in a transformers dump (docs/engines.md says which
and why); ``parity.compare_dumps`` judges the probes a dump declares."""
from __future__ import annotations

# (probe suffix, module path, "out" | "in", layout) — layouts: "tokens" [1, T, ...] -> [T, ...];
# "rows" already [T, ...]; "heads" [1, H, T, d] -> [T, H, d]; "groups" [1, T, G, H/G*d] -> [T, H, d]
LAYER_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("hc.attn.pre", "input_layernorm", "in", "tokens"),
    ("attn.q", "self_attn.q_b_norm", "out", "heads"),
    ("attn.kv", "self_attn.kv_norm", "out", "tokens"),
    ("attn.core", "self_attn.o_a_proj", "in", "groups"),
    ("attn.out", "self_attn", "out", "tokens"),
    ("hc.attn.post", "ffn_hc", "in", "tokens"),
    ("hc.ffn.pre", "post_attention_layernorm", "in", "tokens"),
    ("ffn.routed.out", "mlp.experts", "out", "rows"),
    ("ffn.shared.out", "mlp.shared_experts", "out", "tokens"),
    ("ffn.out", "mlp", "out", "tokens"),
    ("out", "", "out", "tokens"),
)
GLOBAL_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("embed", "model.embed_tokens", "out", "tokens"),
    ("hc_head", "model.hc_head", "out", "tokens"),
    ("final_norm", "model.norm", "out", "tokens"),
    ("logits", "lm_head", "out", "tokens"),
)
