"""Stored-name schemes (spec §2.1, §2.4, §2.5): canonical name -> stored tensor locations. Which
scheme and role suffixes a checkpoint uses is its layout's to say (``layouts.py``).

* ``official``: official names (``layers.3.attn.wq_a.weight`` + ``.scale``), FP8 block weights,
  MXFP4 routed experts; also accepted with a ``model.`` prefix (transformers' ``save_pretrained``).
* ``nvidia-nvfp4``: official names; main-layer routed experts in NVFP4 (``weight``,
  ``weight_scale``, ``weight_scale_2``, ``input_scale``); MTP experts stay MXFP4.
* ``compressed-tensors``: official names; NVFP4 main-layer experts as ``weight_packed``, ``weight_scale``,
  ``weight_global_scale``, ``input_global_scale``; FP8-block attention as ``weight`` + ``weight_scale``
  (its layout's ``fp8_roles``); the rest, the draft included, BF16 ``weight``.
* ``tf-saved``: what transformers 5.x ``save_pretrained`` writes (its reverse of conversion_mapping.py's
  renames, read from a real save of transformers 5.23): official names under ``model.``, except four it
  cannot undo: ``model.embed_tokens``, ``head``, ``model.hc_head.hc_{fn,base,scale}``, and the attention
  ``kv_norm`` saved as ``attn.norm``; experts per expert, parameters in the model dtype.
* ``hf``: transformers-5.x module names; experts fused (``mlp.experts.gate_up_proj [E, 2I, D]``,
  ``down_proj [E, D, I]``) or per expert (``mlp.experts.{e}.gate_proj.weight``); per-tensor
  format from sibling names (``weight_scale_inv`` FP8 block, ``weight_scale`` + ``weight_scale_2``
  NVFP4, else BF16/FP32).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from .names import INDEX, LINEAR, PARAM, WeightSpec


@dataclass(frozen=True)
class Location:
    """Where one role of a weight is stored: a tensor name, optionally a slice of a fused tensor."""

    name: str
    index: tuple | None = None   # (expert, row_start, row_stop) for fused expert tensors

    def label(self) -> str:
        if self.index is None:
            return self.name
        e, a, b = self.index
        return f"{self.name}[{e}]" if a is None else f"{self.name}[{e}, {a}:{b}]"


# ---- official naming ----------------------------------------------------------------------------
OFFICIAL_ROLES = {"weight": ".weight", "scale": ".scale", "weight_scale": ".weight_scale",
                  "weight_scale_2": ".weight_scale_2", "input_scale": ".input_scale"}


def official_candidates(spec: WeightSpec, prefix: str = "",
                        roles: Mapping[str, str] = OFFICIAL_ROLES) -> dict[str, Location]:
    return base_candidates(spec, prefix + spec.full_name, roles)


def base_candidates(spec: WeightSpec, base: str, roles: Mapping[str, str]) -> dict[str, Location]:
    """Stored locations per role of ``spec`` whose stored base name is ``base``."""
    if spec.kind in (PARAM, INDEX):
        return {"weight": Location(base)}
    if spec.kind == LINEAR:
        return {role: Location(base + suf) for role, suf in roles.items()}
    return {"weight": Location(base + ".weight")}


# ---- transformers save_pretrained naming (its reverse key mapping) -------------------------------------
# The '^'-anchored renames (embed, hc_head) do not match once transformers has prefixed 'model.', and
# the rename '.norm.' -> '.kv_norm.' (meant for the compressors) is undone on the attention's own kv_norm.
_TF_SAVED_GLOBAL = {"embed": "model.embed_tokens", "head": "head", "norm": "model.norm",
                    "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
                    "hc_head_scale": "model.hc_head.hc_scale"}
_TF_SAVED_LAYER = {"attn.kv_norm": "attn.norm"}


def tf_saved_base(spec: WeightSpec) -> str:
    if spec.layer is None:
        return _TF_SAVED_GLOBAL[spec.name]
    return f"model.layers.{spec.layer}." + _TF_SAVED_LAYER.get(spec.name, spec.name)


def stored_base(spec: WeightSpec, naming: str) -> str:
    """The stored base name of a main-model weight under a naming scheme (``mtp.*`` keep official names)."""
    if spec.mtp is not None or naming == "official":
        return spec.full_name
    return tf_saved_base(spec) if naming == "tf-saved" else hf_base(spec)


# ---- transformers naming -------------------------------------------------------------------------
_HF_GLOBAL = {"embed": "model.embed_tokens", "head": "lm_head", "norm": "model.norm",
              "hc_head_fn": "model.hc_head.hc_fn", "hc_head_base": "model.hc_head.hc_base",
              "hc_head_scale": "model.hc_head.hc_scale"}
_HF_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a": "self_attn.q_a_proj", "attn.q_norm": "self_attn.q_a_norm", "attn.wq_b": "self_attn.q_b_proj",
    "attn.wkv": "self_attn.kv_proj", "attn.kv_norm": "self_attn.kv_norm", "attn.wo_a": "self_attn.o_a_proj",
    "attn.wo_b": "self_attn.o_b_proj", "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv": "self_attn.compressor.kv_proj", "attn.compressor.wgate": "self_attn.compressor.gate_proj",
    "attn.compressor.ape": "self_attn.compressor.position_bias", "attn.compressor.norm": "self_attn.compressor.kv_norm",
    "attn.indexer.wq_b": "self_attn.compressor.indexer.q_b_proj",
    "attn.indexer.weights_proj": "self_attn.compressor.indexer.scorer.weights_proj",
    "attn.indexer.compressor.wkv": "self_attn.compressor.indexer.kv_proj",
    "attn.indexer.compressor.wgate": "self_attn.compressor.indexer.gate_proj",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm": "self_attn.compressor.indexer.kv_norm",
    "ffn.gate": "mlp.gate", "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1": "mlp.shared_experts.gate_proj", "ffn.shared_experts.w3": "mlp.shared_experts.up_proj",
    "ffn.shared_experts.w2": "mlp.shared_experts.down_proj",
}
_HF_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
HF_ROLES = {"weight": ".weight", "scale": ".weight_scale_inv", "weight_scale": ".weight_scale",
            "weight_scale_2": ".weight_scale_2", "input_scale": ".input_scale"}
_EXPERT_RE = re.compile(r"^ffn\.experts\.(\d+)\.(w[123])$")
HF_FUSED_GATE_UP = "mlp.experts.gate_up_proj"
HF_FUSED_DOWN = "mlp.experts.down_proj"


def hf_base(spec: WeightSpec) -> str:
    if spec.layer is None:
        return _HF_GLOBAL[spec.name]
    prefix = f"model.layers.{spec.layer}."
    m = _EXPERT_RE.match(spec.name)
    if m:
        return prefix + f"mlp.experts.{m.group(1)}.{_HF_EXPERT[m.group(2)]}"
    return prefix + _HF_LAYER[spec.name]


def hf_candidates(spec: WeightSpec, fused: bool, inter: int,
                  roles: Mapping[str, str] = HF_ROLES) -> dict[str, Location]:
    """Stored locations per role. With ``fused`` experts the weight is a slice of the fused tensor."""
    m = _EXPERT_RE.match(spec.name)
    if m and fused:
        e, which = int(m.group(1)), m.group(2)
        prefix = f"model.layers.{spec.layer}."
        if which == "w2":
            return {"weight": Location(prefix + HF_FUSED_DOWN, (e, None, None))}
        lo = 0 if which == "w1" else inter   # gate_up_proj holds w1 then w3 along dim 1
        return {"weight": Location(prefix + HF_FUSED_GATE_UP, (e, lo, lo + inter))}
    return base_candidates(spec, hf_base(spec), roles)
