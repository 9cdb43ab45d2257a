"""Built-in faults of new kinds (mHC, RoPE / YaRN, indexer selection size, KV-cache FP8 scales), each a realistic
slip of a port, registered with the column that must catch it and where it must be localized.

===============================  ======  =====  ===============================================
fault                            column  layer  first divergence must name
===============================  ======  =====  ===============================================
attention_inverse_rope_dropped   logic   0      attention (attn.core: output left rotated)
indexer_topk_off_by_one          logic   1      indexer_weights (attn.indexer.topk: k + 1 kept)
kv_cache_fp8_scale_exponent_   floor   0      attention or kv_cache (the window KV read back
off_by_one                                      with its UE8M0 scales twice too large)
mhc_comb_transposed              logic   1      mhc (hc.attn.post: C[k, j] used for C[j, k])
yarn_dropped_on_compressed_layer logic   1      attention (attn.core: q/k rotated without YaRN)
===============================  ======  =====  ===============================================

The last two are caught and localized only by the FP32 logic column (4e4 x their rules there); at BF16
they hid under BF16 noise (mHC: rel_diff 5.8e-6 at hc.attn.post against a 1e-5 floor).
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from dsv4.layers.rope import Rope
from dsv4.numerics import fp8_act_dequantize

from .registry import FaultTargetError, block_of, patched, register_fault


@register_fault("attention_inverse_rope_dropped", layer=0, component="attention", column="logic",
                description="The attention output's rope dims are not rotated back (the inverse RoPE of spec "
                            "§5 step 6 skipped), so wo_a reads position-rotated values.")
def attention_inverse_rope_dropped(model: Any) -> Iterator[None]:
    attn = block_of(model, 0).attention
    original = attn.apply_rope

    def apply_rope(t: torch.Tensor, positions: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        return t if inverse else original(t, positions)      # BUG: the inverse rotation is dropped

    with patched(attn, "apply_rope", apply_rope):
        yield


@register_fault("indexer_topk_off_by_one", layer=1, component="indexer_weights", column="logic",
                description="The lightning indexer keeps index_topk + 1 entries per query (a <= where < "
                            "belongs): the selection has the wrong size, a judgement of its own, not a crash.")
def indexer_topk_off_by_one(model: Any) -> Iterator[None]:
    attn = block_of(model, 1).attention
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
    storage = block_of(model, 0).attention.kv_storage
    if storage.fmt != "fp8":
        raise FaultTargetError(f"layer 0 kv_cache is {storage.fmt!r} in plan {model.plan.name!r}; the fault needs fp8")

    def decode(s: Any) -> torch.Tensor:
        nope = (fp8_act_dequantize(s.parts["nope"], s.parts["scales"]) * 2.0).to(torch.bfloat16)  # BUG: bias 126
        return torch.cat((nope, s.parts["rope"]), dim=-1)

    with patched(storage, "decode", decode):
        yield


@register_fault("mhc_comb_transposed", layer=1, component="mhc", column="logic",
                description="mHC post mixes the streams with the transposed Sinkhorn matrix (X'_k = sum_j "
                            "C[k, j] X_j instead of C[j, k]; spec §4 step 6 contracts over the first index).")
def mhc_comb_transposed(model: Any) -> Iterator[None]:
    hc = block_of(model, 1).hc_attn
    original = hc.post

    def post(f: torch.Tensor, X: torch.Tensor, p: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        return original(f, X, p, comb.transpose(-1, -2))     # BUG: the wrong index contracted

    with patched(hc, "post", post):
        yield


@register_fault("yarn_dropped_on_compressed_layer", layer=1, component="attention", column="logic",
                description="A compressed (CSA) layer rotates q/k with compress_rope_theta but without the YaRN "
                            "frequency ramp of spec §11 (the window layers' plain RoPE on every layer).")
def yarn_dropped_on_compressed_layer(model: Any) -> Iterator[None]:
    attn = block_of(model, 1).attention
    r = model.config.qk_rope_head_dim
    plain = 1.0 / (model.config.compress_rope_theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))  # BUG: no ramp
    with patched(attn, "rope", Rope(plain.to(attn.rope.omega.device), attn.rope.dim)):
        yield
