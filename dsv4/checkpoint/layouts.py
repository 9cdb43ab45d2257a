"""The checkpoint layouts we know, one declarative description each (data, not code paths).

Detection, validation, lazy reading and the synthetic writer all follow from these entries:

* ``naming``: how canonical names become stored names (``official``: ``layers.3.attn.wq_a``;
  ``hf``: transformers' ``model.layers.3.self_attn.q_a_proj``; ``tf-saved``: what transformers'
  ``save_pretrained`` writes, ``model.layers.3.attn.wq_a``), see ``flavors.py``;
* ``config_form``: the config.json form its writer produces (``hf``, ``transformers`` or
  ``transformers-saved``: transformers' form with the keys its ``save_pretrained`` adds);
* ``roles``: the stored suffix of each role of a quantized linear;
* ``drafts``: which ``mtp.*`` tensors may belong to it (``nextn``: the April block; ``dspark``: the
  0731/0813 DSpark stages; ``none``: transformers drops them); which one a checkpoint has is the
  config's to say (``dspark_block_size``);
* ``expert_format`` / ``linear_format``: what main-layer routed experts and the other quantized
  linears are stored as (what the synthetic writer produces, and what validation accepts);
* ``dtypes``: the stored dtype a release uses per kind of tensor; anything else is refused
  (F32 where BF16 belongs is a different checkpoint, not a detail);
* ``global_scale``: ``multiplier`` (ModelOpt ``weight_scale_2`` = amax/2688) or ``reciprocal``
  (compressed-tensors ``weight_global_scale`` = 2688/amax; nvfp4-and-kernels.md §3.4);
* ``marker``: the stored-name pattern whose presence identifies it, with the reason printed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from .errors import CheckpointError
from .flavors import HF_ROLES as _HF_ROLES, OFFICIAL_ROLES as _OFFICIAL_ROLES

_CT_ROLES = {"weight": ".weight_packed", "weight_scale": ".weight_scale",
             "weight_scale_2": ".weight_global_scale", "input_scale": ".input_global_scale"}
# what the official releases store (spec §2.1-§2.4, dspark.md §3.1)
_OFFICIAL_DTYPES = {"norm": ("BF16",), "table": ("BF16",), "param": ("F32",), "mxfp4": ("I8",),
                    "nvfp4": ("U8",), "fp8_block": ("F8_E4M3",), "dense": ("BF16",)}
_ANY_FLOAT = ("BF16", "F16", "F32")


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    naming: str                       # "official" | "hf"
    roles: Mapping[str, str]
    drafts: tuple[str, ...]           # draft kinds it may carry: "nextn" | "dspark" | "none"
    expert_format: str                # mxfp4 | nvfp4 | fp8_block | dense (synth default; validation below)
    linear_format: str                # fp8_block | nvfp4 | dense
    marker: str                       # regex over stored names
    marker_why: str
    global_scale: str = "multiplier"  # "multiplier" | "reciprocal"
    dtypes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)   # empty: any float dtype
    quant_method: str | None = None   # the quantization_config the synthetic writer records
    config_form: str = "hf"           # "hf" | "transformers" | "transformers-saved" (what synth writes)

    def allowed_dtypes(self, kind: str) -> tuple[str, ...] | None:
        return self.dtypes.get(kind)


LAYOUTS: dict[str, Layout] = {l.name: l for l in (
    Layout("compressed-tensors", "llm-compressor / compressed-tensors NVFP4 (the format vLLM serves)", "hf",
           _CT_ROLES, ("none",), "nvfp4", "nvfp4", r"\.weight_packed$",
           "tensors named '*.weight_packed' (compressed-tensors NVFP4)", global_scale="reciprocal",
           quant_method="compressed-tensors"),
    Layout("hf", "transformers-5.x names (BF16, FP8 block or ModelOpt NVFP4 per tensor)", "hf", _HF_ROLES, ("none", "nextn", "dspark"),
           "dense", "dense", r"^(model\.layers\.\d+\.(self_attn|mlp)\.|lm_head\.weight$)",
           "transformers module names ('model.layers.N.self_attn.*' / 'lm_head.weight')",
           config_form="transformers"),
    Layout("transformers-saved", "what transformers 5.x save_pretrained writes (official names under 'model.', "
           "its own embed / hc_head / kv_norm names; BF16 or FP32)", "tf-saved", _HF_ROLES, ("none",), "dense",
           "dense", r"^model\.(embed_tokens\.weight|hc_head\.hc_fn)$",
           "transformers save_pretrained names ('model.embed_tokens.weight' beside 'model.layers.N.attn.*')",
           config_form="transformers-saved"),
    Layout("nvidia-nvfp4", "NVIDIA ModelOpt NVFP4 (nvidia/DeepSeek-V4-*-NVFP4): NVFP4 routed experts",
           "official", _OFFICIAL_ROLES, ("nextn", "dspark"), "nvfp4", "fp8_block", r"\.weight_scale_2$",
           "official names with '*.weight_scale_2' (ModelOpt NVFP4 global scales)",
           dtypes=_OFFICIAL_DTYPES, quant_method="modelopt"),
    Layout("official-dspark", "DeepSeek official 0731/0813 (FP8 + MXFP4, DSpark stages mtp.0-2)", "official",
           _OFFICIAL_ROLES, ("dspark",), "mxfp4", "fp8_block", r"^(model\.)?mtp\.0\.main_proj\.weight$",
           "official names with 'mtp.0.main_proj.weight' (the DSpark stage-0 projection)", dtypes=_OFFICIAL_DTYPES),
    Layout("official", "DeepSeek official April (FP8 + MXFP4, NextN MTP)", "official", _OFFICIAL_ROLES, ("nextn",),
           "mxfp4", "fp8_block", r"^(model\.)?(layers\.\d+\.(attn|ffn)\.|embed\.weight$)",
           "official names ('layers.N.attn.*' / 'embed.weight') without DSpark or NVFP4 tensors",
           dtypes=_OFFICIAL_DTYPES),
)}
FLAVORS = tuple(LAYOUTS)   # every layout is a flavor of the synthetic writer too


def get_layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise CheckpointError(f"checkpoint layout: expected one of {list(LAYOUTS)}, found {name!r}") from None


def detect_layout(names: Iterable[str]) -> tuple[Layout, str]:
    """The first layout (in the order above, most specific first) whose marker a stored name matches,
    and why. Nothing matches: one error naming the closest layout and the first names that differ."""
    names = sorted(names)
    for layout in LAYOUTS.values():
        rx = re.compile(layout.marker)
        hit = next((n for n in names if rx.search(n)), None)
        if hit is not None:
            return layout, f"{layout.marker_why}: e.g. '{hit}'"
    raise CheckpointError(unknown_layout_message(names))


# a few names each layout's checkpoints always carry (for the 'closest layout' message)
_EXAMPLES = {
    "official": ("embed.weight", "head.weight", "layers.0.attn.wq_a.weight", "layers.0.ffn.gate.weight"),
    "official-dspark": ("embed.weight", "layers.0.attn.wq_a.weight", "mtp.0.main_proj.weight"),
    "nvidia-nvfp4": ("embed.weight", "layers.0.ffn.experts.0.w1.weight_scale_2"),
    "hf": ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.q_a_proj.weight"),
    "transformers-saved": ("model.embed_tokens.weight", "head.weight", "model.layers.0.attn.wq_a.weight",
                           "model.hc_head.hc_fn"),
    "compressed-tensors": ("model.embed_tokens.weight", "model.layers.0.mlp.experts.0.gate_proj.weight_packed"),
}


def unknown_layout_message(names: list[str]) -> str:
    def stem(n: str) -> str:
        return re.sub(r"\.\d+\.", ".N.", n)

    found = {stem(n) for n in names}
    score = {k: sum(stem(e) in found for e in ex) for k, ex in _EXAMPLES.items()}
    best = max(score, key=lambda k: score[k])
    want = [e for e in _EXAMPLES[best] if stem(e) not in found]
    return (f"checkpoint layout: expected one of {list(LAYOUTS)}, found none of their names; closest is "
            f"'{best}' ({LAYOUTS[best].title}), which has {want[:3]} where this checkpoint has "
            f"{names[:3]}")
