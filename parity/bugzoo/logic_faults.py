"""Built-in faults of new kinds (RoPE, indexer selection size, KV-cache FP8 scales), each a realistic
slip of a port, registered with the column that must catch it and where it must be localized.

===============================  ======  =====  ===============================================
fault                            column  layer  first divergence must name
===============================  ======  =====  ===============================================
attention_inverse_rope_dropped   logic   0      attention (attn.core: output left rotated)
indexer_topk_off_by_one          logic   1      indexer_weights (attn.indexer.topk: k + 1 kept)
kv_cache_fp8_scale_exponent_   floor   0      attention or kv_cache (the window KV read back
off_by_one                                      with its UE8M0 scales twice too large)
===============================  ======  =====  ===============================================
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from dsv4.numerics import fp8_act_dequantize

from .registry import FaultTargetError, patched, register_fault


def _block(model: Any, layer: int) -> Any:
    if not 0 <= layer < len(model.blocks):
        raise FaultTargetError(f"layer {layer}: the model has layers 0..{len(model.blocks) - 1}")
    return model.blocks[layer]


@register_fault("attention_inverse_rope_dropped", layer=0, component="attention", column="logic",
                description="The attention output's rope dims are not rotated back (the inverse RoPE of spec "
                            "§5 step 6 skipped), so wo_a reads position-rotated values.")
def attention_inverse_rope_dropped(model: Any) -> Iterator[None]:
    attn = _block(model, 0).attention
    original = attn.apply_rope

    def apply_rope(t: torch.Tensor, positions: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        return t if inverse else original(t, positions)      # BUG: the inverse rotation is dropped

    with patched(attn, "apply_rope", apply_rope):
        yield


@register_fault("indexer_topk_off_by_one", layer=1, component="indexer_weights", column="logic",
                description="The lightning indexer keeps index_topk + 1 entries per query (a <= where < "
                            "belongs): the selection has the wrong size, a judgement of its own, not a crash.")
def indexer_topk_off_by_one(model: Any) -> Iterator[None]:
    attn = _block(model, 1).attention
    indexer = getattr(attn, "indexer", None)
    if indexer is None:
        raise FaultTargetError(f"layer 1 ({model.config.layer_kind(1)}) has no indexer")
    with patched(indexer, "topk", indexer.topk + 1):
        yield


@register_fault("kv_cache_fp8_scale_exponent_off_by_one", layer=0, component="kv_cache", column="floor",
                localization=("attention", "kv_cache"),
                description="The FP8 KV cache decodes its UE8M0 scales as 2^(b - 126) instead of 2^(b - 127) "
                            "(an exponent bias off by one): every stored nope value reads back twice as large.")
def kv_cache_fp8_scale_exponent_off_by_one(model: Any) -> Iterator[None]:
    storage = _block(model, 0).attention.kv_storage
    if storage.fmt != "fp8":
        raise FaultTargetError(f"layer 0 kv_cache is {storage.fmt!r} in plan {model.plan.name!r}; the fault needs fp8")

    def decode(s: Any) -> torch.Tensor:
        nope = (fp8_act_dequantize(s.parts["nope"], s.parts["scales"]) * 2.0).to(torch.bfloat16)  # BUG: bias 126
        return torch.cat((nope, s.parts["rope"]), dim=-1)

    with patched(storage, "decode", decode):
        yield
