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
* ``marker``: the stored-name pattern whose presence identifies it, with the reason printed;
* ``fp8_roles``: the stored suffixes of its FP8-block linears where they differ from ``roles``
  (compressed-tensors: ``weight`` + ``weight_scale`` beside NVFP4's ``weight_packed``), and
  ``fp8_scale_dtype``, the dtype its writer stores their 128x128 block scales in;
* ``rules``: where set, the writer's format per weight, first match wins over the official full name,
  anything unmatched BF16 (compressed-tensors: NVFP4 main-layer experts, FP8-block attention);
* ``draft_copies``: tensors a draft block stores as copies of trunk weights (canonical name in the
  block -> the trunk weight): the compressed-tensors export keeps its calibration model's shared
  embed / head under ``mtp.N.emb.tok_emb`` / ``mtp.N.head``.

Forms we once read into a layout and no published checkpoint has are refused by name (``RETIRED``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

from .errors import CheckpointError
from .flavors import HF_ROLES as _HF_ROLES, OFFICIAL_ROLES as _OFFICIAL_ROLES
from .names import TABLE, WeightSpec

if TYPE_CHECKING:
    from ..config import DSV4Config

_CT_ROLES = {"weight": ".weight_packed", "weight_scale": ".weight_scale",
             "weight_scale_2": ".weight_global_scale", "input_scale": ".input_global_scale"}
# compressed-tensors as published (tests/dsv4/checkpoint/published/canada-quant-flash-nvfp4-fp8-mtp-notes):
# official names; NVFP4 main-layer routed experts; FP8 block 128x128 attention projections, 'weight' +
# 'weight_scale'; everything else BF16, the NextN draft mtp.* included
_CT_FP8_ROLES = {"weight": ".weight", "scale": ".weight_scale"}
_CT_RULES = ((r"^layers\.\d+\.ffn\.experts\.\d+\.w[123]$", "nvfp4"),
             (r"^layers\.\d+\.attn\.(wq_a|wq_b|wkv|wo_a|wo_b)$", "fp8"))
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
    fp8_roles: Mapping[str, str] | None = None   # FP8-block linears' suffixes where they differ from roles
    fp8_scale_dtype: str = "F8_E8M0"  # what the writer stores FP8 block scales as ("F8_E8M0" | "F32")
    rules: tuple[tuple[str, str], ...] = ()      # (regex over official full names, writer format); else BF16
    draft_copies: tuple[tuple[str, str], ...] = ()   # (name in each NextN block, trunk weight it copies)

    def allowed_dtypes(self, kind: str) -> tuple[str, ...] | None:
        return self.dtypes.get(kind)

    def rule_format(self, full_name: str) -> str | None:
        """The writer's format of a linear by ``rules`` ("nvfp4" | "fp8" | "bf16"), None without rules."""
        if not self.rules:
            return None
        return next((fmt for rx, fmt in self.rules if re.match(rx, full_name)), "bf16")

    def draft_copy_specs(self, c: DSV4Config) -> list[tuple[WeightSpec, WeightSpec]]:
        """(copy, trunk weight) per NextN draft block of ``c`` for the layout's ``draft_copies``."""
        if not self.draft_copies or c.dspark_block_size:
            return []
        trunk = {"embed": (c.vocab_size, c.hidden_size), "head": (c.vocab_size, c.hidden_size)}
        return [(WeightSpec(name, None, trunk[src], TABLE, j), WeightSpec(src, None, trunk[src], TABLE))
                for j in range(c.num_nextn_predict_layers) for name, src in self.draft_copies]


LAYOUTS: dict[str, Layout] = {l.name: l for l in (
    Layout("compressed-tensors", "llm-compressor / compressed-tensors mixed precision (the format vLLM serves): "
           "official names, NVFP4 routed experts, FP8-block attention, the rest BF16", "official",
           _CT_ROLES, ("none", "nextn"), "nvfp4", "fp8_block", r"^(layers|mtp)\.\d+\..*\.weight_packed$",
           "official names with '*.weight_packed' (compressed-tensors NVFP4)", global_scale="reciprocal",
           quant_method="compressed-tensors", fp8_roles=_CT_FP8_ROLES, fp8_scale_dtype="F32", rules=_CT_RULES,
           draft_copies=(("emb.tok_emb", "embed"), ("head", "head"))),
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


# forms an earlier reading of ours described and no published checkpoint has: refused by name
RETIRED = (
    (r"^model\.layers\.\d+\..*\.weight_packed$",
     "compressed-tensors with transformers module names (our earlier reading; the published export uses "
     "official names): expected names such as 'layers.N.ffn.experts.E.w1.weight_packed' and "
     "'layers.N.attn.wq_a.weight_scale' (docs/formats.md)"),
)


def detect_layout(names: Iterable[str]) -> tuple[Layout, str]:
    """The first layout (in the order above, most specific first) whose marker a stored name matches,
    and why. Nothing matches: one error naming the closest layout and the first names that differ."""
    names = sorted(names)
    for rx, why in RETIRED:
        hit = next((n for n in names if re.search(rx, n)), None)
        if hit is not None:
            raise CheckpointError(f"checkpoint layout: {why}; found '{hit}'")
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
    "compressed-tensors": ("embed.weight", "layers.0.attn.wq_a.weight_scale",
                           "layers.0.ffn.experts.0.w1.weight_packed"),
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
