"""Faults the field actually had: DeepSeek-V4 accuracy bugs fixed in public by the serving engines
and ports since the April release, each re-expressed on our tiny models, our layouts and our layers
(docs/bugzoo.md, "Bugs from the field": the survey, with the bugs we could not express and why).
Every description cites the public thread it comes from.

Trunk faults register through the same ``register_fault`` door users have; weight and loader bugs
pass ``checkpoint=``: a faulty copy of the checkpoint is written once per process and the fault's
native side loads it, so the loader and the weight audit see the bug as an engine would. Draft
faults register with the DSpark zoo (``python -m parity.dspark zoo``).

==================================  ==========  =====  =================================================
fault                               column      layer  first divergence must name
==================================  ==========  =====  =================================================
field_shared_expert_unclamped       logic       1      shared_expert (ffn.shared.out)
field_routed_experts_unclamped      logic       2      routed_experts (ffn.routed.out)
field_router_sigmoid_scores         logic       3      router (ffn.router.topk_ids / weights)
field_router_bias_not_loaded        logic       3      router (checkpoint: zero correction bias)
field_attn_sink_fp32_read_as_bf16   logic       0      attention (checkpoint: sink bytes misread)
field_compressed_layer_base_theta   logic       1      attention (q/k rotated with rope_theta + YaRN)
field_compressed_entries_unrotated  logic       2      compressor (attn.compressed_kv never rotated)
field_compressed_rope_entry_index   logic       1      compressor (entry j rotated at j, not j*m)
field_compressor_last_channel_      logic       1      compressor (last channel of each token's
  crosses_row                                            kv/score read from the next token's row)
field_kernel_act_scale_mantissa_    bug_budget  0      attn_q (activation scales stored as powers of
  dropped                                                two, codes computed with the true scale)
==================================  ==========  =====  =================================================
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from dsv4.layers.rope import Rope, yarn_ramp

from .backends import kernel_fault, swap_backend
from .dspark_faults import register as register_draft
from .registry import block_of, patched, register_fault

# ---- faulty checkpoint copies (weight and loader bugs) ---------------------------------------------
_COPIES: dict[tuple[str, str], str] = {}
_TMP: list[tempfile.TemporaryDirectory] = []
atexit.register(lambda: [t.cleanup() for t in _TMP])


def faulty_copy(tag: str, edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[str], str]:
    """``path -> copy``: the checkpoint directory copied once per process with ``edit`` applied to its
    tensors (every ``*.safetensors`` file; metadata kept). What an engine's faulty loader would have
    computed is written as the stored value, so our loader reads the bug as that engine did."""
    def make(path: str) -> str:
        key = (tag, str(Path(path).resolve()))
        if key not in _COPIES:
            from safetensors import safe_open
            from safetensors.torch import save_file

            tmp = tempfile.TemporaryDirectory(prefix=f"bugzoo-{tag}-")
            _TMP.append(tmp)
            out = Path(tmp.name) / Path(path).name
            shutil.copytree(path, out, ignore=shutil.ignore_patterns("*.safetensors"))
            for f in sorted(Path(path).glob("*.safetensors")):
                with safe_open(str(f), framework="pt") as h:
                    meta = h.metadata()
                    tensors = {k: h.get_tensor(k) for k in h.keys()}
                edit(tensors)
                save_file(tensors, str(out / f.name), metadata=meta)
            _COPIES[key] = str(out)
        return _COPIES[key]
    return make


def _sink_read_as_bf16(tensors: dict[str, torch.Tensor]) -> None:
    # the FP32 sink buffer indexed with a 2-byte stride: head h reads the h-th half-word of the buffer
    for name in [n for n in tensors if n == "layers.0.attn.attn_sink"]:
        t = tensors[name]
        tensors[name] = t.contiguous().view(torch.bfloat16)[: t.numel()].to(t.dtype).clone()


def _bias_not_loaded(tensors: dict[str, torch.Tensor]) -> None:
    # the loader looked for another tensor name and kept a zero correction bias
    name = "layers.3.ffn.gate.bias"
    tensors[name] = torch.zeros_like(tensors[name])


def _unchanged(model: Any) -> Iterator[None]:
    yield      # the checkpoint carries the bug: nothing to patch on the instance


# ---- SwiGLU clamp missing ----------------------------------------------------------------------------
def _unclamped(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g.to(torch.float32)) * u.to(torch.float32)      # BUG: swiglu_limit never applied


@register_fault("field_shared_expert_unclamped", layer=1, component="shared_expert", column="logic",
                description="The shared expert runs a bare SiLU-and-mul: swiglu_limit never reaches it while the "
                            "routed experts clamp. Field: https://github.com/sgl-project/sglang/pull/23776 (spurious "
                            "'16' tokens), https://github.com/Blaizzy/mlx-vlm/pull/1469, "
                            "https://github.com/hw-native-sys/pypto-lib/pull/470")
def field_shared_expert_unclamped(model: Any) -> Iterator[None]:
    with patched(block_of(model, 1).moe.shared, "swiglu", _unclamped):
        yield


@register_fault("field_routed_experts_unclamped", layer=2, component="routed_experts", column="logic",
                description="The routed experts' fused MoE is built without swiglu_limit (the shared expert has "
                            "it). Field: https://github.com/vllm-project/vllm-ascend/pull/14364 (logits cliffs, "
                            "top-1 12/47 -> 44/47 after the fix), https://github.com/HYGON-AI/sglang-das/pull/118, "
                            "https://github.com/HYGON-AI/sglang-das/pull/250 (garbled MATH-500 on W4A8 DeepEP)")
def field_routed_experts_unclamped(model: Any) -> Iterator[None]:
    with patched(block_of(model, 2).moe, "swiglu", _unclamped):
        yield


# ---- routing ---------------------------------------------------------------------------------------
@register_fault("field_router_sigmoid_scores", layer=3, component="router", column="logic",
                description="A fused-MoE routing method without sqrt-softplus silently routes with sigmoid "
                            "scores (selection and weights). Field: https://github.com/flashinfer-ai/flashinfer/"
                            "issues/5190, https://github.com/flashinfer-ai/flashinfer/pull/5211")
def field_router_sigmoid_scores(model: Any) -> Iterator[None]:
    with patched(block_of(model, 3).moe.router, "score", lambda logits: torch.sigmoid(logits)):
        yield


@register_fault("field_router_bias_not_loaded", layer=3, component="router", column="logic",
                checkpoint=faulty_copy("bias-not-loaded", _bias_not_loaded),
                description="Loader bug, injected at the checkpoint: the score-routed layer's ffn.gate.bias "
                            "(the noaux_tc correction bias) is looked up under another name and stays zero, so "
                            "expert selection changes. Field: https://github.com/Avarok-Cybersecurity/atlas/"
                            "pull/186")
def field_router_bias_not_loaded(model: Any) -> Iterator[None]:
    yield from _unchanged(model)


# ---- attention -------------------------------------------------------------------------------------
@register_fault("field_attn_sink_fp32_read_as_bf16", layer=0, component="attention", column="logic",
                checkpoint=faulty_copy("sink-as-bf16", _sink_read_as_bf16),
                description="Loader/kernel-argument bug, injected at the checkpoint: the FP32 attn_sink buffer is "
                            "indexed as BF16, so head h reads the h-th half-word (some heads get huge sinks and "
                            "vanish). Field: https://github.com/Avarok-Cybersecurity/atlas/pull/341")
def field_attn_sink_fp32_read_as_bf16(model: Any) -> Iterator[None]:
    yield from _unchanged(model)


@register_fault("field_compressed_layer_base_theta", layer=1, component="attention", column="logic",
                description="A compressed layer rotates q/k with rope_theta (the window layers' base) plus YaRN "
                            "instead of compress_rope_theta plus YaRN: the compress rope is built but never used. "
                            "Field: https://github.com/ml-explore/mlx-lm/pull/1189 (broken past ~4.9K tokens)")
def field_compressed_layer_base_theta(model: Any) -> Iterator[None]:
    c = model.config
    attn = block_of(model, 1).attention
    r, theta = c.qk_rope_head_dim, c.rope_theta          # BUG: the base theta on a compressed layer
    omega = 1.0 / (theta ** (torch.arange(0, r, 2, dtype=torch.float32) / r))
    ramp = yarn_ramp(r, theta, c.original_seq_len, c.beta_fast, c.beta_slow)
    omega = omega / c.rope_factor * ramp + omega * (1.0 - ramp)
    with patched(attn, "rope", Rope(omega.to(attn.rope.omega.device), attn.rope.dim)):
        yield


# ---- compressor ------------------------------------------------------------------------------------
@register_fault("field_compressed_entries_unrotated", layer=2, component="compressor", column="logic",
                description="The compressed pool's keys are never RoPE-rotated (the compress rope is allocated "
                            "but not applied to the pooled entries). Field: https://github.com/ml-explore/mlx-lm/"
                            "pull/1189 (collapse beyond the 128-token window)")
def field_compressed_entries_unrotated(model: Any) -> Iterator[None]:
    comp = block_of(model, 2).attention.compressor
    with patched(comp, "apply_rope", lambda entries, first: entries):
        yield


@register_fault("field_compressed_rope_entry_index", layer=1, component="compressor", column="logic",
                description="Compressed KV entry j is rotated at position j (its index in the pool) instead of "
                            "j * compress_ratio (its original-sequence position). Field: "
                            "https://github.com/AMD-AGI/Primus/pull/930")
def field_compressed_rope_entry_index(model: Any) -> Iterator[None]:
    comp = block_of(model, 1).attention.compressor

    def apply_rope(entries: torch.Tensor, first: int) -> torch.Tensor:
        pos = torch.arange(first, first + entries.shape[0], device=entries.device)    # BUG: no * ratio
        return comp.rope.apply(entries, pos)

    with patched(comp, "apply_rope", apply_rope):
        yield


@register_fault("field_compressor_last_channel_crosses_row", layer=1, component="compressor", column="logic",
                description="A compressor kernel's per-core hidden-axis start is not aligned to its copy block, "
                            "so the last element of each token's kv and score rows is read across the row "
                            "boundary (from the next token's first element). Field: "
                            "https://github.com/GDzhu01/vllm-ascend-deepseekv4/pull/83")
def field_compressor_last_channel_crosses_row(model: Any) -> Iterator[None]:
    comp = block_of(model, 1).attention.compressor
    real = comp.project

    def cross(t: torch.Tensor) -> torch.Tensor:
        flat = t.reshape(-1).clone()
        n = t.shape[-1]
        last = torch.arange(n - 1, flat.numel() - 1, n, device=t.device)
        flat[last] = flat[last + 1]       # BUG: one element past the row
        return flat.reshape(t.shape)

    def project(x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        kv, gate = real(x)
        return cross(kv), cross(gate)

    with patched(comp, "project", project):
        yield


# ---- kernel: a scale's mantissa lost when packing -------------------------------------------------
def act_scale_mantissa_dropped(scale_bytes: torch.Tensor) -> torch.Tensor:
    """E4M3 activation block scales stored with their mantissa bits cleared (a power of two, rounded
    down) while the FP4 codes were computed with the true scale; subnormal bytes are left as they are."""
    b = scale_bytes.reshape(-1)
    exp = (b.to(torch.int16) >> 3) & 0xF
    return torch.where(exp > 0, b & 0xF8, b).reshape(scale_bytes.shape)


MANTISSA_DROPPED = kernel_fault("bugzoo-field-act-scale-mantissa-dropped", act_scales=act_scale_mantissa_dropped)


@register_fault("field_kernel_act_scale_mantissa_dropped", layer=0, component="attn_q", column="bug_budget",
                backend=MANTISSA_DROPPED,
                description="Kernel bug: activation scales are packed by taking the exponent without the "
                            "mantissa, so a scale that is not a power of two is stored rounded down; the codes were "
                            "quantized with the true scale (our NVFP4 analogue of the UE8M0 packing bug that gave "
                            "NaN in fp8_einsum on B200/B300). Field: https://github.com/sgl-project/sglang/pull/25733")
def field_kernel_act_scale_mantissa_dropped(model: Any) -> Iterator[None]:
    with swap_backend(model, MANTISSA_DROPPED):
        yield


# ---- DSpark draft (python -m parity.dspark zoo) ------------------------------------------------------
class _NoSharedExpert:
    """A shared expert whose weights were never loaded (left zero): its output is zero."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __call__(self, x: Any) -> torch.Tensor:
        out = self.real(x)
        return torch.zeros_like(out)


@register_draft("field_dspark_shared_experts_dropped", place="stage 0", component="draft_shared_expert",
                column="logic",
                description="The draft stages' shared-expert tensors are dropped by the engine's loader (left "
                            "zero), acceptance falling to ~26 % at half the throughput. Field: "
                            "https://github.com/eugr/spark-vllm-docker/issues/331")
def field_dspark_shared_experts_dropped(draft: Any) -> Iterator[None]:
    import contextlib

    with contextlib.ExitStack() as stack:
        for stage in draft.blocks:
            stack.enter_context(patched(stage.moe, "shared", _NoSharedExpert(stage.moe.shared)))
        yield


def padded_width(n: int, minimum: int = 128) -> int:
    """The sparse kernel's key width: the next power of two, at least ``minimum`` columns."""
    w = 1
    while w < n:
        w *= 2
    return max(w, minimum)


@register_draft("field_dspark_padding_in_softmax", place="stage 0", component="attention", column="logic",
                description="Non-causal draft attention passes the padded key width as the active length, so the "
                            "padding keys (score 0, value 0) enter every stage's softmax normalization (133 valid "
                            "keys padded to 256 weighed 133/256). Field: https://github.com/vllm-project/vllm/"
                            "pull/57432 (V4.1 DSpark; the 0731 draft has the same block attention)")
def field_dspark_padding_in_softmax(draft: Any) -> Iterator[None]:
    import contextlib

    def padded(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def softmax_with_sink(scores: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor) -> torch.Tensor:
            K = scores.shape[-1]
            pad = padded_width(K) - K
            s = torch.cat((scores, scores.new_zeros(scores.shape[:-1] + (pad,))), dim=-1)
            v = torch.cat((valid, valid.new_ones(valid.shape[:-1] + (pad,))), dim=-1)
            return real(s, v, sink)[..., :K]       # BUG: the padding was in the denominator
        return softmax_with_sink

    with contextlib.ExitStack() as stack:
        for stage in draft.blocks:
            att = stage.attention
            stack.enter_context(patched(att, "softmax_with_sink", padded(att.softmax_with_sink)))
        yield
