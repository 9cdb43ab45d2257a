"""The precision plan a quantized checkpoint implies (ModelOpt or compressed-tensors NVFP4), and the
check that a user's plan does not contradict it.

The checkpoint is the authority on what was quantized: its tensors say which weights are NVFP4,
FP8-block or high precision, and its quantization config names the modules it excludes. Per plan
class (``dsv4.probes.PLAN_CLASSES``): every main-layer weight NVFP4 -> ``fp4``, FP8 block -> ``fp8``,
BF16 -> ``bf16``. A class stored in two formats cannot be one plan entry: that is an error naming one
module of each. Contradictions with a user's plan (each an error naming the module):

* a plan that quantizes (fp4/fp8) a module the quantization config excludes, beyond the format it is
  stored in (an excluded FP8-block module may run fp8: NVIDIA's release ignores its FP8 attention);
* a plan that re-quantizes an NVFP4-stored module into FP8 (a second, lossy rounding).

Upcasting (plan ``bf16`` for NVFP4-stored weights) is allowed: it is exact.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .checkpoint.names import component_class
from .checkpoint.quant_configs import QuantConfig
from .plan import PRESETS, PlanError, PrecisionPlan

_PLAN_OF_STORED = {"nvfp4": "fp4", "fp8_block": "fp8", "dense": "bf16"}
_NVFP4_PRODUCERS = ("modelopt", "compressed-tensors")


def stored_formats(reader: Any) -> dict[str, dict[str, str]]:
    """``{plan class: {stored base name: format kind}}`` over the main layers and the head."""
    out: dict[str, dict[str, str]] = defaultdict(dict)
    c = reader.config
    for layer in [None, *range(c.num_hidden_layers)]:
        for name in reader.weight_names(layer):
            cls = component_class(name)
            if cls is not None:
                full = name if layer is None else f"layers.{layer}.{name}"
                out[cls][full] = reader.weight_format(name, layer).kind
    return dict(out)


def checkpoint_plan(reader: Any) -> PrecisionPlan | None:
    """The plan of a ModelOpt / compressed-tensors checkpoint, or None for any other checkpoint."""
    qc: QuantConfig | None = reader.quant_config
    if qc is None or qc.producer not in _NVFP4_PRODUCERS:
        return None
    comp = dict(PRESETS["default"])
    for cls, fmts in stored_formats(reader).items():
        kinds = {_PLAN_OF_STORED.get(k, k) for k in fmts.values()}
        if len(kinds) > 1:
            example = {k: next(n for n, f in fmts.items() if _PLAN_OF_STORED.get(f, f) == k) for k in sorted(kinds)}
            raise PlanError(f"checkpoint {reader.path}: class {cls} is stored in {len(kinds)} formats "
                            f"({', '.join(f'{k} in {n}' for k, n in example.items())}); a precision plan has one "
                            f"format per class")
        kind = kinds.pop()
        if kind not in ("fp4", "fp8", "bf16"):
            raise PlanError(f"checkpoint {reader.path}: class {cls}: stored as {kind}, which no plan format "
                            f"reproduces (expected NVFP4, FP8 block or BF16)")
        comp[cls] = kind
    return PrecisionPlan("default", tuple(comp.items()))


def check_plan_against_checkpoint(plan: PrecisionPlan, reader: Any) -> None:
    """Raise PlanError naming the first module a plan contradicts (see the module docstring)."""
    qc: QuantConfig | None = reader.quant_config
    if qc is None or qc.producer not in _NVFP4_PRODUCERS or plan.act_dtype == "fp32":
        return
    # the layout's own module names; compressed-tensors' published ignore list also names transformers modules
    # ('lm_head') beside official ones ('re:.*\.gate$'), so both are tried there
    hf_names = _hf_modules(reader) if reader.layout.naming == "hf" or qc.producer == "compressed-tensors" else {}
    for cls, fmts in stored_formats(reader).items():
        want = plan[cls]
        for full, kind in fmts.items():
            pat = qc.excludes(hf_names.get(full, full)) or qc.excludes(full)
            # excluded = left by the quantizer as stored: NVIDIA's MIXED_PRECISION release ignores its
            # FP8-block attention / shared experts, so fp8 there is the checkpoint itself, not a requantization
            if pat is not None and want in ("fp4", "fp8") and want != _PLAN_OF_STORED.get(kind):
                keep = "fp8 (as stored) or bf16" if kind == "fp8_block" else "bf16"
                raise PlanError(f"plan {plan.name}: {cls}={want} quantizes {full}, which the checkpoint's "
                                f"{qc.source} excludes ({pat!r}); expected {keep} for {cls}")
            if kind == "nvfp4" and want == "fp8":
                raise PlanError(f"plan {plan.name}: {cls}=fp8 re-quantizes {full}, stored NVFP4 in the "
                                f"checkpoint; expected fp4 (as stored) or bf16 (exact upcast)")


def _hf_modules(reader: Any) -> dict[str, str]:
    """Official base name -> transformers module name (compressed-tensors ignores use the latter)."""
    from .checkpoint.flavors import hf_base
    from .checkpoint.names import all_weights

    return {s.full_name: hf_base(s) for s in all_weights(reader.config) if s.kind == "linear" or s.name == "head"}
