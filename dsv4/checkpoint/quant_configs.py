"""Quantization configs a checkpoint ships (NVIDIA ModelOpt, compressed-tensors): read, and written
by the synthetic writer for the layouts that carry them.

* ModelOpt: ``hf_quant_config.json`` ``{"producer": {"name": "modelopt"}, "quantization":
  {"quant_algo": "NVFP4" | "MIXED_PRECISION", "moe_quant_algo": "NVFP4", "group_size": 16,
  "exclude_modules": [...]}}``, mirrored in ``config.json`` ``quantization_config``
  (spec dsv4-architecture.md §2.4, nvfp4-and-kernels.md §3.4).
* compressed-tensors: ``config.json`` ``quantization_config`` ``{"quant_method":
  "compressed-tensors", "format": "nvfp4-pack-quantized", "config_groups": {...}, "ignore": [...]}``, or
  ``"format": "mixed-precision"`` with per-group formats (NVFP4 experts + ``float-quantized`` FP8 block);
  ``re:`` entries are regular expressions, the others module names or globs.

Compute-free (no torch): the reference may import it.
"""
from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..config import DSV4Config
from .errors import CheckpointError

HF_QUANT_FILE = "hf_quant_config.json"


@dataclass(frozen=True)
class QuantConfig:
    """What a checkpoint's quantization config says: its producer, the algorithm, the group size and
    the modules it excludes (kept in high precision)."""

    producer: str                 # "modelopt" | "compressed-tensors" | "fp8" (the official block FP8)
    algo: str                     # "NVFP4", "MIXED_PRECISION", "nvfp4-pack-quantized", "fp8"
    group_size: int | None
    exclude: tuple[str, ...]
    source: str                   # the file (and key) it came from

    def excludes(self, module: str) -> str | None:
        """The exclude pattern matching ``module`` (a stored base name), else None."""
        for pat in self.exclude:
            if pat.startswith("re:"):
                if re.fullmatch(pat[3:], module):
                    return pat
            elif fnmatch.fnmatchcase(module, pat) or module == pat:
                return pat
        return None


def read_quant_config(base: Path, config_dict: Mapping[str, Any] | None) -> QuantConfig | None:
    """The checkpoint's quantization config (``hf_quant_config.json`` first, then ``config.json``'s
    ``quantization_config``), or None. A config we cannot read is one error naming the key."""
    f = base / HF_QUANT_FILE
    if f.exists():
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{f}: expected JSON, found a syntax error ({e})") from None
        q = d.get("quantization") if isinstance(d, Mapping) else None
        if not isinstance(q, Mapping):
            raise CheckpointError(f"{f}: expected a 'quantization' object, found {type(q).__name__}")
        return _modelopt(q, str(f), producer=str((d.get("producer") or {}).get("name", "modelopt")))
    q = (config_dict or {}).get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    src = "config.json quantization_config"
    method = q.get("quant_method")
    if method == "compressed-tensors":
        fmt = str(q.get("format", ""))
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, Mapping)]
        # an NVFP4 + FP8-block export (RedHat's, canada-quant's) says "mixed-precision" at the top and
        # each group's own format: its NVFP4 group is the one that makes it a DeepSeek-V4 NVFP4 checkpoint
        nvfp4 = [g for g in groups if "nvfp4" in str(g.get("format", fmt))]
        if "nvfp4" not in fmt and not (fmt == "mixed-precision" and nvfp4):
            raise CheckpointError(f"{src}: compressed-tensors format: expected 'nvfp4-pack-quantized' (or "
                                  f"'mixed-precision' with an nvfp4-pack-quantized group), found {fmt!r} (other "
                                  f"compressed-tensors schemes are not DeepSeek-V4 NVFP4)")
        weights = [g.get("weights") or {} for g in (nvfp4 or groups)]
        gs = next((int(w["group_size"]) for w in weights if w.get("group_size")), 16)
        return QuantConfig("compressed-tensors", fmt, gs, tuple(q.get("ignore") or ()), src)
    if method == "modelopt" or "quant_algo" in q or q.get("producer"):
        return _modelopt(q, src, producer="modelopt")
    if method == "fp8":
        return QuantConfig("fp8", "fp8", None, tuple(q.get("ignore") or ()), src)
    raise CheckpointError(f"{src}: quant_method: expected 'fp8', 'modelopt' or 'compressed-tensors', "
                          f"found {method!r}")


def _modelopt(q: Mapping[str, Any], src: str, producer: str) -> QuantConfig:
    algo = str(q.get("quant_algo", ""))
    if algo not in ("NVFP4", "MIXED_PRECISION"):
        raise CheckpointError(f"{src}: quant_algo: expected 'NVFP4' or 'MIXED_PRECISION', found {algo!r}")
    gs = q.get("group_size", 16)
    if gs != 16:
        raise CheckpointError(f"{src}: group_size: expected 16 (NVFP4 blocks), found {gs!r}")
    exclude = tuple(q.get("exclude_modules") or q.get("ignore") or ())
    return QuantConfig(producer, algo, 16, exclude, src)


# ---- what the synthetic writer records --------------------------------------------------------------
_ALWAYS_BF16_GLOBS = ("*.ffn.gate", "*.compressor.*", "*.indexer.weights_proj", "head")


def layout_quant_files(layout: Any, c: DSV4Config) -> dict[str, Any]:
    """Files (and the ``quantization_config`` entry) a synthetic checkpoint of ``layout`` carries."""
    if layout.quant_method == "modelopt":   # NVIDIA's release: FP8 trunk kept, NVFP4 routed experts
        # the keys NVIDIA's config.json is checked to carry (published/nvidia-flash-nvfp4-preflight):
        # producer modelopt / dsv4-nvfp4-experts, MIXED_PRECISION + moe_quant_algo NVFP4, group 16, 'mtp.*'
        # ignored, and one quantized_layers entry per main layer's routed experts
        producer = {"name": "modelopt", "version": "dsv4-nvfp4-experts"}
        layers = {f"layers.{i}.ffn.experts": {"group_size": 16, "quant_algo": "NVFP4"}
                  for i in range(c.num_hidden_layers)}
        q = {"quant_algo": "MIXED_PRECISION", "moe_quant_algo": "NVFP4", "group_size": 16,
             "kv_cache_quant_algo": None, "quantized_layers": layers, "exclude_modules": ["mtp.*", *_ALWAYS_BF16_GLOBS]}
        qc = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
              "weight_block_size": [128, 128], "producer": producer, **q, "ignore": q["exclude_modules"]}
        qc.pop("exclude_modules")   # config.json spells the list 'ignore', hf_quant_config.json 'exclude_modules'
        return {"quantization_config": qc, HF_QUANT_FILE: {"producer": producer, "quantization": q}}
    if layout.quant_method == "compressed-tensors":
        # the published export's config (canada-quant-flash-nvfp4-fp8-mtp-notes facts.json, 'recipe'): format
        # mixed-precision, an FP8-block group over the attention projections, an NVFP4 group over the routed
        # experts, and its ignore list, verbatim. Its targets and ignores name its calibration model's modules
        # (experts gate/up/down_proj, lm_head, embed_tokens); the stored names are official, and the reader
        # takes each weight's format from its tensors, not from the targets.
        nvfp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
        fp8 = {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128],
               "symmetric": True, "dynamic": False}
        return {"quantization_config": {
            "quant_method": "compressed-tensors", "format": "mixed-precision",
            "config_groups": {
                "group_0": {"targets": [r"re:.*attn\.(wq_a|wq_b|wkv|wo_a|wo_b)$"], "weights": fp8,
                            "input_activations": None, "format": "float-quantized"},
                "group_1": {"targets": [r"re:.*ffn\.experts\.\d+\.(gate_proj|up_proj|down_proj)$"],
                            "weights": dict(nvfp4, dynamic=False), "input_activations": dict(nvfp4, dynamic="local"),
                            "format": "nvfp4-pack-quantized"}},
            "ignore": ["lm_head", r"re:.*\.embed_tokens$", r"re:.*\.norm$", r"re:.*\.gate$", r"re:.*\.q_norm$",
                       r"re:.*\.k_norm$", r"re:.*mtp\..*"]}}
    return {}
