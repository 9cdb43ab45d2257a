"""Which vLLM module gives which probe: DeepSeek-V4 in vLLM 0.33.0 (``vllm/models/deepseek_v4/nvidia``).

Data, in the table format of :mod:`parity.engines.hooks`; read from the pinned source (the module
tree in ``trees/vllm-0.33.0.json``, written by ``python -m parity.engines.module_tree`` from the
wheel's files) and checked against it by tests/parity/test_engine_maps.py. vLLM runs tokens flat
(``[T, ...]``, no batch dimension): every layout is "rows".

What vLLM does not materialize, so no hook can give it (docs/engines.md): the mHC pre/post streams
and the layer outputs (``mhc_pre`` / ``mhc_fused_post_pre`` / ``mhc_post`` are fused tilelang kernels
that also apply ``attn_norm`` / ``ffn_norm``, and a layer returns (x, residual, post_mix, res_mix)),
the attention internals (q, kv, compressed entries, indexer: inside fused ops), the router
(computed inside the fused MoE op) and the routed experts' output alone (the fused MoE returns
routed + shared). ``logits``: vLLM computes only the sampled positions' logits unless prompt
logprobs are requested; run with ``SamplingParams(prompt_logprobs=0)`` so every position is there."""
from __future__ import annotations

VERSION = "0.33.0"
TREE = f"trees/vllm-{VERSION}.json"
ROOT = "DeepseekV4ForCausalLM"
LAYERS_PATH = "model.layers"
DSPARK_ROOT = "DSparkDeepseekV4ForCausalLM"
DSPARK_LAYERS_PATH = "model.layers"
# Sub-modules the source builds through a factory; the class each factory returns there
# (nvidia/model.py: ``self.model = self.model_cls(...)`` with ``model_cls = DeepseekV4Model``;
# ``_select_dsv4_attn_cls`` returns a DeepseekV4Attention subclass for the configured backend).
FACTORIES = {"self.model_cls": "DeepseekV4Model", "_select_dsv4_attn_cls()": "DeepseekV4Attention"}

# (probe suffix, module path under model.layers.{i}, "out" | "in", layout)
LAYER_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("attn.out", "attn", "out", "rows"),                  # DeepseekV4Attention.forward returns _o_proj(...)
    ("ffn.shared.out", "ffn.shared_experts", "out", "rows"),
    ("ffn.out", "ffn", "out", "rows"),                    # routed x scale + shared
)
GLOBAL_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("embed", "model.embed_tokens", "out", "rows"),
    ("hc_head", "model.norm", "in", "rows"),              # hc_head_fused_kernel -> self.norm
    ("final_norm", "model.norm", "out", "rows"),
    ("logits", "logits_processor", "out", "rows"),
)
# The DSpark draft (DSparkDeepseekV4ForCausalLM): its stages continue the layer numbering after
# the target's layers, as in the reference (reference/dspark.py), and its hc_head output feeds norm.
DSPARK_LAYER_PROBES = LAYER_PROBES
DSPARK_GLOBAL_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("dspark.hc_head", "model.norm", "in", "rows"),
)
