"""Which SGLang module gives which probe: DeepSeek-V4 in SGLang 0.5.23 (``sglang/srt/models/deepseek_v4.py``,
the DSpark draft in ``deepseek_v4_dspark.py``, the MoE block from ``deepseek_v2.py``).

Data, in the table format of :mod:`parity.engines.hooks`; read from the pinned source (the module
tree in ``trees/sglang-0.5.23.json``, written by ``python -m parity.engines.module_tree`` from the
wheel's files) and checked against it by tests/parity/test_engine_maps.py. SGLang runs tokens flat
(``[T, ...]``): every layout is "rows". The rows hold for attention tensor parallelism 1: with more
ranks ``self_attn`` returns ``AttnOutput(partial)``, one rank's share before the fused reduction.

What SGLang does not hand to a module boundary, so no hook can give it (docs/engines.md): the mHC
streams and the layer outputs (the layer's ``attn_boundary`` / ``ffn_boundary`` fuse the hyper-
connection pre/post with the norms), the attention internals, the top-k selection and weights
(``TopK`` / ``HashTopK`` return a ``TopKOutput``), the routed experts alone and the MoE block's sum
(``mlp`` is called with ``leave_output_sum=True`` and returns the unmerged pieces as a
``MergedMoEOutput``; the sum is taken in the boundary), and the logits (``LogitsProcessor`` returns
a ``LogitsProcessorOutput`` with the pruned positions only). Of DSpark, the base and Markov-
corrected logits are computed by functions (``project_through_lm_head``), not modules."""
from __future__ import annotations

VERSION = "0.5.23"
TREE = f"trees/sglang-{VERSION}.json"
ROOT = "DeepseekV4ForCausalLM"
LAYERS_PATH = "model.layers"
DSPARK_ROOT = "DeepseekV4ForCausalLMDSpark"
DSPARK_LAYERS_PATH = "stages"
# The experts' class comes from get_moe_impl_class(quant_config) (a runtime choice per quantization);
# no row ends there, so no factory is needed.
FACTORIES: dict[str, str] = {}

# (probe suffix, module path under the layer, "out" | "in", layout)
LAYER_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("attn.out", "self_attn", "out", "rows"),            # MQALayer.forward: _project_wo_b(o) (or AttnOutput(o))
    ("ffn.router.logits", "mlp.gate", "out", "rows"),    # MoEGate.forward: fp32 F.linear logits (hash layers too)
    ("ffn.shared.out", "mlp.shared_experts", "out", "rows"),   # DeepseekV2MLP, called via _forward_shared_experts
)
GLOBAL_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("embed", "model.embed_tokens", "out", "rows"),
    ("hc_head", "model.norm", "in", "rows"),             # DeepseekV4Model.forward: self.hc_head(...) -> self.norm
    ("final_norm", "model.norm", "out", "rows"),
)
# The DSpark draft: stage s is layer L+s in the probe names (as in reference/dspark.py); stage 0 joins
# the captured target rows (project_target_hidden: main_proj then main_norm), the last stage's norm
# follows the drafter's hc head (_logits_from_x_post_hc).
DSPARK_LAYER_PROBES = LAYER_PROBES
DSPARK_GLOBAL_PROBES: tuple[tuple[str, str, str, str], ...] = (
    ("dspark.main_hidden", "stages.0.main_proj", "in", "rows"),
    ("dspark.join", "stages.0.main_norm", "out", "rows"),
    ("dspark.hc_head", "stages.{last}.norm", "in", "rows"),   # {last}: the last stage (hooks.fill_rows)
)
