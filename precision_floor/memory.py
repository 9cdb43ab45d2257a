"""Weight bytes of a plan, per component class, from the config alone (nothing is loaded).

Every canonical weight of ``dsv4.checkpoint.names.all_weights`` (MTP excluded: the native model does
not run it) is counted in the format the native model holds it under the plan: a planned linear in its
class's format (``fp4``: NVFP4 stored shapes — packed E2M1, an E4M3 scale per 16, two FP32 scalars;
``fp8``: E4M3 with 128x128 block scales; ``bf16``: dense), everything else as stored for compute
(norms and tables BF16, fp32 parameters, int64 hash tables). The head is stored as a dense table but
planned as ``lm_head``, so it follows the plan. ``kv_cache`` holds activations, not weights: it costs
nothing here (its cost grows with context length, not with the checkpoint).

The same accounting as ``parity.memory.model_weights`` (a test checks the totals agree), kept here
per class because the floor search reports which class buys what.
"""
from __future__ import annotations

import math
from collections import defaultdict

import pandas as pd

from dsv4.checkpoint.formats import DENSE, FP8_BLOCK, NVFP4, stored_shapes
from dsv4.checkpoint.names import INDEX, LINEAR, PARAM, all_weights, component_class
from dsv4.config import DSV4Config
from dsv4.plan import FORMATS, PrecisionPlan

# Bytes per element of each stored role (packed FP4 already has 2 elements per byte in its shape).
_ROLE_BYTES = {NVFP4: {"weight": 1, "weight_scale": 1, "weight_scale_2": 4, "input_scale": 4},
               FP8_BLOCK: {"weight": 1, "scale": 4}, DENSE: {"weight": 2}}
_FMT_KIND = {"fp4": NVFP4, "fp8": FP8_BLOCK, "bf16": DENSE}
UNPLANNED = "(unplanned)"   # embed, norms, mHC parameters, router bias, hash tables


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def format_bytes(fmt: str, shape: tuple[int, ...]) -> int:
    if fmt == "fp32":      # the logic column's whole-model FP32 mode: dense, 4 bytes per element
        return _numel(shape) * 4
    kind = _FMT_KIND[fmt]
    return sum(_numel(s) * _ROLE_BYTES[kind][role] for role, s in stored_shapes(kind, shape).items())


def class_shapes(config: DSV4Config) -> dict[str, list[tuple[int, ...]]]:
    """Plan class -> the logical [out, in] shapes of its weights."""
    out: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    for spec in all_weights(config, mtp=False):
        cls = component_class(spec.name) if (spec.kind == LINEAR or spec.name == "head") else None
        if cls is not None:
            out[cls].append(spec.shape)
    return dict(out)


def unplanned_bytes(config: DSV4Config) -> int:
    """Every tensor no plan class covers: NORM and TABLE (embed) in the BF16 activation dtype, fp32
    parameters, int64 hash tables."""
    per = {PARAM: 4, INDEX: 8}
    return sum(_numel(spec.shape) * per.get(spec.kind, 2) for spec in all_weights(config, mtp=False)
               if not (spec.kind == LINEAR or spec.name == "head"))


def class_bytes_table(config: DSV4Config) -> pd.DataFrame:
    """One row per plan class with weights: its bytes in each format (the cost of each choice)."""
    rows = [{"class": cls, **{fmt: sum(format_bytes(fmt, s) for s in ss) for fmt in FORMATS}}
            for cls, ss in class_shapes(config).items()]
    return pd.DataFrame(rows).set_index("class")


def plan_bytes_by_class(config: DSV4Config, plan: PrecisionPlan) -> dict[str, int]:
    out = {cls: sum(format_bytes(plan[cls], s) for s in ss) for cls, ss in class_shapes(config).items()}
    out[UNPLANNED] = unplanned_bytes(config)
    return out


def plan_bytes(config: DSV4Config, plan: PrecisionPlan) -> int:
    """Total weight bytes of the native model under ``plan``."""
    return sum(plan_bytes_by_class(config, plan).values())


def bytes_vs(config: DSV4Config, plan: PrecisionPlan, base: str = "all-fp4") -> dict[str, float]:
    """``plan``'s bytes against a preset: absolute, extra bytes, and the ratio."""
    b, ref = plan_bytes(config, plan), plan_bytes(config, PrecisionPlan.preset(base))
    return {"bytes": b, "base": base, "base_bytes": ref, "extra_bytes": b - ref, "ratio": b / ref}


__all__ = ["UNPLANNED", "bytes_vs", "class_bytes_table", "class_shapes", "format_bytes", "plan_bytes",
           "plan_bytes_by_class", "unplanned_bytes"]
