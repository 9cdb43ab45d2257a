"""The built-in faults: known-bad variants of the native model, one per check worth proving
(docs/methods.md §9 "proving the harness").

Targets exist in the tiny model: layer 0 window / hash routing, 1 CSA / hash, 2 HCA / score,
3 CSA / score. Each registration states the column that must raise the alarm and where the first
divergence must point (layer, component class):

=================================  ==========  =====  ===========================================
fault                              column      layer  first divergence must name
=================================  ==========  =====  ===========================================
compressor_ape_on_content_csa      logic       1      compressor (attn.compressed_kv)
compressor_ape_on_content_hca      logic       2      compressor (attn.compressed_kv)
swiglu_clamp_after_silu_routed     logic       2      routed_experts (ffn.routed.out)
swiglu_clamp_after_silu_shared     logic       1      shared_expert (ffn.shared.out)
fused_swiglu_unclamped_sigmoid     bug_budget  0      routed_experts or shared_expert (every layer
                                                      runs the bad epilogue; layer 0 is first)
lm_head_fp4                        floor       None   lm_head (logits)
router_gate_fp4                    floor       3      router (ffn.router.logits)
indexer_rope_v32_layout            logic       3      indexer_q (attn.indexer.q)
fp8_scale_grid_transposed          logic       3      attn_o (attn.out: wo_b's weight)
nvfp4_scales_read_swizzled         logic       1      routed_experts (ffn.routed.out)
attention_sink_dropped             logic       0      attention (attn.core)
routed_scaling_factor_dropped      logic       2      router (ffn.router.weights carries the factor)
hash_routing_ignored               logic       0      router (ffn.router.topk_ids)
=================================  ==========  =====  ===========================================

Weight faults (scale layouts) re-read the stored weight from the checkpoint the model was built from
and convert it to the format the patched layer already uses, so they act in every plan: in the
logic column's all-fp32 plan they are load-time dequantization bugs.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace as dc_replace
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from dsv4.checkpoint import open_checkpoint
from dsv4.checkpoint.formats import FP8_BLOCK, NVFP4, StoredWeight
from dsv4.layers.linear import Bf16Weight, Fp4Linear, Fp4Weight, Fp8Weight, Fp32Weight, Linear
from dsv4.layers.rope import Rope
from dsv4.numerics import fp8_block_dequantize, nvfp4_dequantize, nvfp4_quantize, unswizzle_scales
from dsv4.weights import convert_rows, stack_bank, to_device

from .backends import kernel_fault, swap_backend, unclamped_sigmoid_epilogue
from .registry import FaultTargetError, block_of, patched, register_fault

UNCLAMPED_SIGMOID_BACKEND = kernel_fault("bugzoo-emulated-unclamped-sigmoid", unclamped_sigmoid_epilogue)


# ---- helpers -------------------------------------------------------------------------------------
def _attention_part(model: Any, layer: int, part: str) -> Any:
    obj = getattr(block_of(model, layer).attention, part)
    if obj is None:
        kind = model.config.layer_kind(layer)
        raise FaultTargetError(f"layer {layer} ({kind}) has no {part}; pick a layer that has one")
    return obj


@contextlib.contextmanager
def _kept(d: dict) -> Iterator[None]:
    """Restore a dict's contents on exit (the object itself is kept: others hold references to it)."""
    saved = dict(d)
    try:
        yield
    finally:
        d.clear()
        d.update(saved)


def _dense_fp32(lin: Linear) -> torch.Tensor:
    """The weight a linear computes with, as FP32 ``[N, K]``."""
    w = lin.weight
    if isinstance(w, Fp4Weight):
        return nvfp4_dequantize(w.packed, w.scales, w.global_scale)
    if isinstance(w, Fp8Weight):
        return fp8_block_dequantize(w.weight, w.scale)
    assert isinstance(w, (Bf16Weight, Fp32Weight))
    return w.weight.to(torch.float32)


@contextlib.contextmanager
def _as_fp4(model: Any, owner: Any, attr: str, device: str) -> Iterator[None]:
    """Replace ``owner.attr`` (a linear) by an NVFP4 W4A4 linear over the same weight: the precision
    mistake of computing a class in FP4 that the plan keeps in higher precision."""
    lin: Linear = getattr(owner, attr)
    if lin.fmt == "fp32":   # the FP32 logic model has no NVFP4 path: a precision mistake does not apply there
        raise FaultTargetError(f"{lin.name}: fp32 in plan {model.plan.name!r} (the FP32 logic column); an NVFP4 "
                               f"precision fault does not apply")
    if lin.fmt == "fp4":
        raise FaultTargetError(f"{lin.name}: already fp4 in plan {model.plan.name!r}; the fault would change nothing")
    packed, scales, g = nvfp4_quantize(_dense_fp32(lin))
    dispatcher = model.dispatchers[device]
    with _kept(dispatcher.log.expected):   # Fp4Linear registers itself as an expected kernel user
        fp4 = Fp4Linear(lin.name, lin.component, Fp4Weight(packed.contiguous(), scales.contiguous(),
                                                           g.to(torch.float32)),
                        dispatcher=dispatcher, act_scale=model.act_scale, out_dtype=lin.out_dtype)
        with patched(owner, attr, fp4):
            yield


def _stored(model: Any, name: str, layer: int) -> StoredWeight:
    return open_checkpoint(model.checkpoint_path).weight(name, layer)


def _with_tensor(sw: StoredWeight, role: str, t: torch.Tensor) -> StoredWeight:
    return StoredWeight({**sw.tensors, role: t}, dc_replace(sw.fmt), dict(sw.names))


def _same_format_as(current: object, sws: list[StoredWeight], device: torch.device) -> object:
    """Convert stored weights (rows concatenated) to the format of ``current``, as the loader does."""
    fmt = {Fp4Weight: "fp4", Fp8Weight: "fp8", Bf16Weight: "bf16", Fp32Weight: "fp32"}[type(current)]
    return convert_rows([to_device(sw, device) for sw in sws], fmt)[0]


def _v32_rope(rope: Rope, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's indexer RoPE layout: the LEADING ``dim`` entries, rotated in non-interleaved
    halves (pair i = ``(x[i], x[i + dim/2])``) — instead of V4's trailing, interleaved pairs."""
    r = rope.dim
    cos, sin = rope.cos_sin(positions)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (r // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    head = x[..., :r].to(torch.float32)
    a, b = head[..., :r // 2], head[..., r // 2:]
    rot = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., r:]), dim=-1)


# ---- compressor ----------------------------------------------------------------------------------
def _ape_on_content(model: Any, layer: int) -> contextlib.AbstractContextManager[None]:
    comp = _attention_part(model, layer, "compressor")

    def pool(kv: torch.Tensor, gate_logits: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(gate_logits + ape, dim=1)
        return (w * (kv + ape)).sum(dim=1)     # BUG: the positional bias also lands on the content

    return patched(comp, "pool", pool)


@register_fault("compressor_ape_on_content_csa", layer=1, component="compressor", column="logic",
                description="CSA compressor adds its positional bias (ape) to the pooled KV content, not "
                            "only to the gate logits (spec §6 step 1).")
def compressor_ape_on_content_csa(model: Any) -> Iterator[None]:
    with _ape_on_content(model, 1):
        yield


@register_fault("compressor_ape_on_content_hca", layer=2, component="compressor", column="logic",
                description="HCA compressor adds its positional bias (ape) to the pooled KV content.")
def compressor_ape_on_content_hca(model: Any) -> Iterator[None]:
    with _ape_on_content(model, 2):
        yield


# ---- SwiGLU ----------------------------------------------------------------------------------------
def _clamp_after_silu(expert: Any) -> contextlib.AbstractContextManager[None]:
    limit = expert.swiglu_limit

    def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        # BUG: the clamp acts on silu(gate) instead of on the gate before the SiLU
        return torch.clamp(F.silu(g.to(torch.float32)), max=limit) * torch.clamp(u.to(torch.float32), -limit, limit)

    return patched(expert, "swiglu", swiglu)   # a patched swiglu also switches the fused epilogue off


@register_fault("swiglu_clamp_after_silu_routed", layer=2, component="routed_experts", column="logic",
                description="Routed experts clamp silu(gate) to the SwiGLU limit instead of clamping the gate "
                            "before the SiLU (spec §9 step 5).")
def swiglu_clamp_after_silu_routed(model: Any) -> Iterator[None]:
    with _clamp_after_silu(block_of(model, 2).moe):
        yield


@register_fault("swiglu_clamp_after_silu_shared", layer=1, component="shared_expert", column="logic",
                description="The shared expert clamps silu(gate) instead of the gate (spec §9 step 6).")
def swiglu_clamp_after_silu_shared(model: Any) -> Iterator[None]:
    with _clamp_after_silu(block_of(model, 1).moe.shared):
        yield


@register_fault("fused_swiglu_unclamped_sigmoid", layer=0, component="routed_experts", column="bug_budget",
                localization=("routed_experts", "shared_expert"), backend=UNCLAMPED_SIGMOID_BACKEND,
                description="Kernel epilogue bug: the fused SwiGLU computes min(g, L) * sigmoid(g), the sigmoid "
                            "reading the unclamped gate. Lives in a kernel backend (a copy of emulated with this "
                            "epilogue), so only emulated <-> kernel can see it; every layer runs it, layer 0 first.")
def fused_swiglu_unclamped_sigmoid(model: Any) -> Iterator[None]:
    with swap_backend(model, UNCLAMPED_SIGMOID_BACKEND):
        yield


# ---- precision mistakes --------------------------------------------------------------------------
@register_fault("lm_head_fp4", layer=None, component="lm_head", column="floor",
                description="The LM head computes in NVFP4 W4A4 while the plan keeps it in BF16.")
def lm_head_fp4(model: Any) -> Iterator[None]:
    with _as_fp4(model, model.head_module, "lm_head", model.device_map["head"]):
        yield


@register_fault("router_gate_fp4", layer=3, component="router", column="floor",
                description="The router gate of a score-routed layer computes in NVFP4 while the plan keeps "
                            "it in BF16 (FP32 logits).")
def router_gate_fp4(model: Any) -> Iterator[None]:
    with _as_fp4(model, block_of(model, 3).moe.router, "gate", model.device_map[3]):
        yield


# ---- indexer -------------------------------------------------------------------------------------
@register_fault("indexer_rope_v32_layout", layer=3, component="indexer_q", column="logic",
                description="The indexer applies RoPE in the DeepSeek-V3.2 layout (leading dims, non-interleaved "
                            "half split) to its queries and keys (spec §7 step 2, §16.1).")
def indexer_rope_v32_layout(model: Any) -> Iterator[None]:
    idx = _attention_part(model, 3, "indexer")
    comp = idx.compressor

    def key_rope(entries: torch.Tensor, first: int) -> torch.Tensor:
        pos = torch.arange(first, first + entries.shape[0], device=entries.device) * comp.ratio
        return _v32_rope(comp.rope, entries, pos)

    with patched(idx, "apply_rope", lambda t, positions: _v32_rope(idx.rope, t, positions)), \
            patched(comp, "apply_rope", key_rope):
        yield


# ---- weight scale layouts ------------------------------------------------------------------------
_GRID_LAYER = 3   # asymmetric 2x2 wo_b grids in both tiny seed 0 and tiny-trained (layers 0-2 of the trained model are uniform)


@register_fault("fp8_scale_grid_transposed", layer=_GRID_LAYER, component="attn_o", column="logic",
                description="attn.wo_b's FP8 128x128 UE8M0 scale grid is read transposed at load, so blocks "
                            "(i, j) and (j, i) swap their scales.")
def fp8_scale_grid_transposed(model: Any) -> Iterator[None]:
    # A symmetric grid would hide the bug, so the layer is one whose grid is asymmetric in both built-in
    # checkpoints; another checkpoint with a symmetric grid there gets a clear error.
    i = _GRID_LAYER
    lin = block_of(model, i).attention.wo_b
    sw = _stored(model, "attn.wo_b", i)
    if sw.fmt.kind != FP8_BLOCK:
        raise FaultTargetError(f"layers.{i}.attn.wo_b: expected an FP8 block weight in the checkpoint, found "
                               f"{sw.fmt.describe()}")
    s = sw.tensors["scale"]
    if s.shape[0] != s.shape[1] or torch.equal(s.view(torch.uint8), s.view(torch.uint8).T):
        raise FaultTargetError(f"layers.{i}.attn.wo_b: its scale grid {s.view(torch.uint8).tolist()} is symmetric "
                               f"or not square: reading it transposed would change nothing")
    bad = _with_tensor(sw, "scale", s.T.contiguous())
    with patched(lin, "weight", _same_format_as(lin.weight, [bad], torch.device(model.device_map[i]))):
        yield


@register_fault("nvfp4_scales_read_swizzled", layer=1, component="routed_experts", column="logic",
                description="The routed experts' NVFP4 block scales (stored linear) are read as if 32_4_4 "
                            "swizzled at load.")
def nvfp4_scales_read_swizzled(model: Any) -> Iterator[None]:
    moe = block_of(model, 1).moe
    dev = torch.device(model.device_map[1])
    reader = open_checkpoint(model.checkpoint_path)

    def misread(name: str) -> StoredWeight:
        sw = reader.weight(name, 1)
        if sw.fmt.kind != NVFP4:
            raise FaultTargetError(f"layers.1.{name}: expected an NVFP4 weight, found {sw.fmt.describe()}")
        s = sw.tensors["weight_scale"]
        return _with_tensor(sw, "weight_scale", unswizzle_scales(s.reshape(-1), *s.shape))

    experts = range(moe.n_experts)
    # a bank has the class of its per-expert weights, so it names the target format too
    w13 = stack_bank([_same_format_as(moe.w13.weight, [misread(f"ffn.experts.{e}.w1"), misread(f"ffn.experts.{e}.w3")],
                                      dev) for e in experts])
    w2 = stack_bank([_same_format_as(moe.w2.weight, [misread(f"ffn.experts.{e}.w2")], dev) for e in experts])
    with patched(moe.w13, "weight", w13), patched(moe.w2, "weight", w2):
        yield


# ---- attention and routing logic -----------------------------------------------------------------
@register_fault("attention_sink_dropped", layer=0, component="attention", column="logic",
                description="The attention softmax drops the learned sink from its denominator (spec §5 step 5).")
def attention_sink_dropped(model: Any) -> Iterator[None]:
    attn = block_of(model, 0).attention

    def softmax(scores: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores.masked_fill(~valid[None], float("-inf")), dim=-1)

    with patched(attn, "softmax_with_sink", softmax):
        yield


@register_fault("routed_scaling_factor_dropped", layer=2, component="router", column="logic",
                description="Routing weights are renormalized but never multiplied by routed_scaling_factor "
                            "(spec §9 step 4); the router.weights probe carries the factor, so the router "
                            "localizes it.")
def routed_scaling_factor_dropped(model: Any) -> Iterator[None]:
    router = block_of(model, 2).moe.router

    def weigh(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        w = scores.gather(-1, ids)
        return w / w.sum(dim=-1, keepdim=True)

    with patched(router, "weigh", weigh):
        yield


@register_fault("hash_routing_ignored", layer=0, component="router", column="logic",
                description="A hash-routed layer selects experts by score top-k instead of tid2eid[token].")
def hash_routing_ignored(model: Any) -> Iterator[None]:
    router = block_of(model, 0).moe.router
    if not hasattr(router, "tid2eid"):
        raise FaultTargetError("layer 0: expected a hash-routed layer")

    def select(scores: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        return scores.topk(router.topk, dim=-1).indices

    with patched(router, "select", select):
        yield

from . import kernel_faults  # noqa: E402,F401  (registers the kernel faults judged by the audit)
from . import logic_faults  # noqa: E402,F401  (faults of new kinds: mHC, RoPE, indexer size, KV scales)
from . import field_faults  # noqa: E402,F401  (bugs fixed in public by the engines: docs/bugzoo.md "Bugs from the field")
