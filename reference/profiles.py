"""Numerics profiles of the reference, selectable by name (spec §12).

* ``bf16``: the precision table of §12 without its fake-quantization rows: BF16 weights and
  activations, fp32 for mHC, routing, softmax statistics, compressor projection/pooling, MoE
  accumulation and logits; attention probabilities rounded to the activation dtype before P·V.
* ``official``: the same plus every fake-quantization point of §12 with the official kernels'
  rounding: FP8 E4M3 activations (per token, blocks of 128, UE8M0) into the linears the official
  model runs as FP8/FP4 GEMMs; FP8 (block 64) on the nope dims of the window kv and of the attention
  compressor output; Hadamard + FP4 E2M1 (block 32) on indexer queries and keys.

The activation dtype (bf16 or fp32) is a separate parameter of ``load_model``.
"""
from __future__ import annotations

from dataclasses import dataclass

from dsv4.config import DSV4Config


@dataclass(frozen=True)
class Profile:
    name: str
    act_quant: bool     # §12 row 1: FP8 activations into FP8/FP4 GEMM linears
    kv_fp8: bool        # §12 rows 2-3: window kv and attention-compressor nope dims
    indexer_fp4: bool   # §12 row 4: Hadamard + FP4 on indexer q and keys


PROFILES: dict[str, Profile] = {
    "bf16": Profile("bf16", act_quant=False, kv_fp8=False, indexer_fp4=False),
    "official": Profile("official", act_quant=True, kv_fp8=True, indexer_fp4=True),
}

# §2.3 / OFF-M `Linear`: the non-expert linears declared with the default (FP8) dtype. wo_a is bf16
# (an einsum), the compressor, indexer weights_proj, gate and head are bf16/fp32 F.linear.
_FP8_LINEARS = frozenset({"attn.wq_a", "attn.wq_b", "attn.wkv", "attn.wo_b", "attn.indexer.wq_b",
                          "ffn.shared_experts.w1", "ffn.shared_experts.w2", "ffn.shared_experts.w3"})


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile: expected one of {sorted(PROFILES)}, found {name!r}") from None


def gemm_quantizes_input(config: DSV4Config, name: str) -> bool:
    """Whether the official model quantizes this linear's input to FP8 (§12 row 1): FP8 weights when
    config.dtype == 'fp8'; routed experts also when expert_dtype is fp4/fp8 (fp4_gemm takes FP8 input)."""
    if name.startswith("ffn.experts."):
        return config.dtype == "fp8" or config.expert_dtype in ("fp4", "fp8")
    return config.dtype == "fp8" and name in _FP8_LINEARS
