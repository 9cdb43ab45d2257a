"""``--dry-run``: a per-device memory estimate from the config and the plan; nothing is loaded.

Weights: every canonical weight of ``dsv4.checkpoint.names.all_weights`` (MTP excluded: neither model
runs it) in the format each model holds it — the reference dequantizes every linear to its activation
dtype; the native model holds a linear in its plan class's format (fp4: NVFP4 stored shapes, fp8:
128x128-block FP8, bf16: dense), everything else as the reference does. Probes: what the harness
copies to the host per prompt of T tokens (shapes of docs/model_surface.md). Models are built one at
a time, so the peak per device is the largest single model, not their sum.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from dsv4.checkpoint.formats import DENSE, FP8_BLOCK, NVFP4, stored_shapes
from dsv4.checkpoint.names import INDEX, LINEAR, NORM, PARAM, TABLE, all_weights, component_class
from dsv4.config import DSV4Config
from dsv4.plan import PrecisionPlan

_FMT_KIND = {"fp4": NVFP4, "fp8": FP8_BLOCK, "bf16": DENSE}
# bytes per element of each stored role (packed FP4 is 2 elements per byte, already in its shape).
_ROLE_BYTES = {NVFP4: {"weight": 1, "weight_scale": 1, "weight_scale_2": 4, "input_scale": 4},
               FP8_BLOCK: {"weight": 1, "scale": 4}, DENSE: {"weight": 2}}


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape) if shape else 1


def weight_bytes(kind: str, shape: tuple[int, ...]) -> int:
    return sum(_numel(s) * _ROLE_BYTES[kind][role] for role, s in stored_shapes(kind, shape).items())


def _other_bytes(spec_kind: str, shape: tuple[int, ...], act_bytes: int) -> int:
    if spec_kind == PARAM:
        return _numel(shape) * 4
    if spec_kind == INDEX:
        return _numel(shape) * 8
    return _numel(shape) * act_bytes   # NORM, TABLE


def _device_key(spec_layer: int | None, name: str) -> Any:
    if spec_layer is not None:
        return spec_layer
    return "embed" if name == "embed" else "head"


@dataclass
class MemoryEstimate:
    model: str
    per_device: dict[str, int] = field(default_factory=dict)

    def add(self, device: str, nbytes: int) -> None:
        self.per_device[device] = self.per_device.get(device, 0) + nbytes

    @property
    def total(self) -> int:
        return sum(self.per_device.values())


def model_weights(config: DSV4Config, devices: Mapping[Any, str], plan: PrecisionPlan | None,
                  act_bytes: int = 2, label: str = "") -> MemoryEstimate:
    """``plan=None``: the reference (all linears dense in the activation dtype)."""
    est = MemoryEstimate(label or ("reference" if plan is None else f"native:{plan.name}"))
    for spec in all_weights(config, mtp=False):
        dev = devices[_device_key(spec.layer, spec.name)]
        if spec.kind == LINEAR or (spec.name == "head" and plan is not None):
            # The head is stored as a dense table but planned (and quantized) as the lm_head linear.
            cls = component_class(spec.name)
            fmt = "bf16" if plan is None or cls is None else plan[cls]
            if plan is None:
                nbytes = _numel(spec.shape) * act_bytes
            elif fmt == "fp32":
                nbytes = _numel(spec.shape) * 4
            else:
                nbytes = weight_bytes(_FMT_KIND[fmt], spec.shape)
        elif spec.kind in (NORM, TABLE, PARAM, INDEX):
            nbytes = _other_bytes(spec.kind, spec.shape, act_bytes)
        else:
            raise ValueError(f"unknown weight kind {spec.kind!r} for {spec.full_name}")
        est.add(dev, nbytes)
    return est


def probe_bytes(config: DSV4Config, tokens: int) -> int:
    """Host bytes of one prefill's probes (BF16 activations, fp32 logits/scores/router, int64 ids)."""
    c, T = config, tokens
    D, H, d, n = c.hidden_size, c.num_attention_heads, c.head_dim, c.hc_mult
    total = T * D * 2 * 3 + T * c.vocab_size * 4     # embed, hc_head, final_norm + logits
    for i in range(c.num_hidden_layers):
        kind, m = c.layer_kind(i), c.compress_ratio(i)
        total += T * D * 2 * 6 + T * n * D * 2 * 2 + T * H * d * 2 * 2 + T * d * 2   # dense probes
        total += T * c.n_routed_experts * 4 + T * c.num_experts_per_tok * (8 + 4)   # router
        if kind != "window":
            total += (T // m) * d * 2
        if kind == "csa":
            n_entries, k = T // m, min(c.index_topk, max(T // m, 1))
            total += T * c.index_n_heads * c.index_head_dim * 2 + n_entries * c.index_head_dim * 2
            total += T * n_entries * 4 + T * k * 8
    return total


def estimate(config: DSV4Config, devices: Mapping[Any, str], plan: PrecisionPlan, tokens: int,
             ref_act_bytes: int = 2, n_prompts: int = 1, anchor_runs: int = 2) -> dict[str, Any]:
    """``anchor_runs``: probe sets kept per prompt while a column runs (the reference run(s) of the
    prompt set, plus the emulated run anchoring the bug-budget column)."""
    """Everything the dry run prints: per model and device, the peak, and host probe bytes."""
    models = [model_weights(config, devices, None, ref_act_bytes, "reference"),
              model_weights(config, devices, None, 4, "reference fp32 (logic)"),
              model_weights(config, devices, PrecisionPlan.preset("all-fp32"), 4, label="native:all-fp32 (logic)"),
              model_weights(config, devices, plan, label=f"native:{plan.name} (floor / bug budget)")]
    all_devices = sorted({d for m in models for d in m.per_device})
    peak = {d: max(m.per_device.get(d, 0) for m in models) for d in all_devices}
    probes_one = probe_bytes(config, tokens)
    return {"models": [{"model": m.model, "per_device": m.per_device, "total": m.total} for m in models],
            "peak_per_device": peak, "tokens": tokens, "probe_host_bytes_per_prompt": probes_one,
            # anchors of every prompt stay on the host, plus the current test side's probes
            "probe_host_bytes_held": probes_one * (n_prompts * anchor_runs + 1)}
