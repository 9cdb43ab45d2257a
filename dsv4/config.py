"""DSV4Config: one typed configuration for DeepSeek-V4, read from any of its three config forms.

Forms (spec dsv4-architecture.md §1):
  (a) the HF ``config.json`` (``compress_ratios`` with its extra MTP entry, ``rope_scaling``, ...),
  (b) the transformers-5.x form (``layer_types``, ``mlp_layer_types``, ``rope_parameters``,
      ``compress_rates``),
  (c) the official ``inference/config.json`` (ModelArgs names: ``dim``, ``n_layers``, ...).

This module is compute-free: the reference may import it.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from .config_keys import ALLOW_ENV, allow_unknown_default, screen_hf_keys


class ConfigError(ValueError):
    """An invalid or inconsistent configuration; the message names the key, expected and found."""


LAYER_KINDS = ("window", "csa", "hca")
_TF_LAYER_TYPE = {"window": "sliding_attention", "csa": "compressed_sparse_attention",
                  "hca": "heavily_compressed_attention"}
_TF_LAYER_TYPE_INV = {v: k for k, v in _TF_LAYER_TYPE.items()}


@dataclass(frozen=True)
class DSV4Config:
    """Every size and constant the model needs. Field names follow the HF config where one exists."""

    name: str = "custom"
    vocab_size: int = 129280
    hidden_size: int = 4096
    num_hidden_layers: int = 43
    num_attention_heads: int = 64
    head_dim: int = 512
    qk_rope_head_dim: int = 64
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    sliding_window: int = 128
    # One entry per main layer (0 = window only, csa_ratio, hca_ratio); the MTP entry is separate.
    compress_ratios: tuple[int, ...] = ()
    mtp_compress_ratios: tuple[int, ...] = (0,)
    csa_ratio: int = 4
    hca_ratio: int = 128
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_factor: float = 16.0
    original_seq_len: int = 65536
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    max_position_embeddings: int = 1048576
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 6
    moe_intermediate_size: int = 2048
    num_hash_layers: int = 3
    scoring_func: str = "sqrtsoftplus"
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    num_nextn_predict_layers: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 1
    # Checkpoint storage: "fp8" (FP8 E4M3 + UE8M0 128x128 non-expert linears) or "bf16";
    # expert_dtype "fp4" (MXFP4), "fp8" (Flash-Base) or None (same as dtype).
    dtype: str = "fp8"
    expert_dtype: str | None = "fp4"
    quantization_config: Mapping[str, Any] | None = field(default=None, compare=False)
    # DSpark draft of the 0731/0813 releases (dspark.md §2); block size 0 = no DSpark (April NextN MTP).
    # Its stages are the trailing compress_ratios entries (mtp_compress_ratios), all 0 (window only).
    dspark_block_size: int = 0
    dspark_noise_token_id: int = 0
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 0
    # Keys of the source config that were ignored on the user's explicit opt-in (provenance).
    ignored_keys: tuple[str, ...] = field(default=(), compare=False)

    # ---- validation -------------------------------------------------------------------------
    def __post_init__(self) -> None:
        def need(cond: bool, key: str, expected: str, found: Any) -> None:
            if not cond:
                raise ConfigError(f"config '{self.name}': {key}: expected {expected}, found {found!r}")

        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
                    "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "index_n_heads",
                    "index_head_dim", "index_topk", "sliding_window", "hc_mult", "hc_sinkhorn_iters",
                    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
                    "max_position_embeddings", "csa_ratio", "hca_ratio"):
            v = getattr(self, key)
            need(isinstance(v, int) and not isinstance(v, bool) and v > 0, key, "a positive int", v)
        need(len(self.compress_ratios) == self.num_hidden_layers, "compress_ratios",
             f"{self.num_hidden_layers} entries (one per main layer)", len(self.compress_ratios))
        allowed = {0, self.csa_ratio, self.hca_ratio}
        bad = [r for r in self.compress_ratios if r not in allowed]
        need(not bad, "compress_ratios", f"values in {sorted(allowed)}", bad)
        need(self.csa_ratio != self.hca_ratio, "csa_ratio/hca_ratio", "two different ratios",
             (self.csa_ratio, self.hca_ratio))
        need(self.sliding_window >= max(self.csa_ratio, self.hca_ratio), "sliding_window",
             f">= the largest compress ratio {max(self.csa_ratio, self.hca_ratio)} (spec §6 causality)",
             self.sliding_window)
        need(self.head_dim > self.qk_rope_head_dim and self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
             f"an even number < head_dim {self.head_dim}", self.qk_rope_head_dim)
        need(self.index_head_dim >= self.qk_rope_head_dim, "index_head_dim",
             f">= qk_rope_head_dim {self.qk_rope_head_dim}", self.index_head_dim)
        need(self.num_attention_heads % self.o_groups == 0, "o_groups",
             f"a divisor of num_attention_heads {self.num_attention_heads}", self.o_groups)
        need(self.num_experts_per_tok <= self.n_routed_experts, "num_experts_per_tok",
             f"<= n_routed_experts {self.n_routed_experts}", self.num_experts_per_tok)
        need(0 <= self.num_hash_layers <= self.num_hidden_layers, "num_hash_layers",
             f"0..{self.num_hidden_layers}", self.num_hash_layers)
        need(self.n_shared_experts == 1, "n_shared_experts", "1 (the official MoE asserts it)",
             self.n_shared_experts)
        need(self.scoring_func == "sqrtsoftplus", "scoring_func", "'sqrtsoftplus'", self.scoring_func)
        need(self.dtype in ("fp8", "bf16"), "dtype", "'fp8' or 'bf16'", self.dtype)
        need(self.expert_dtype in ("fp4", "fp8", None), "expert_dtype", "'fp4', 'fp8' or None",
             self.expert_dtype)
        need(0 <= self.bos_token_id < self.vocab_size and 0 <= self.eos_token_id < self.vocab_size,
             "bos_token_id/eos_token_id", f"ids < vocab_size {self.vocab_size}",
             (self.bos_token_id, self.eos_token_id))

        if self.dspark_block_size:
            self._check_dspark(need)

    def _check_dspark(self, need: Any) -> None:
        L = self.num_hidden_layers
        need(isinstance(self.dspark_block_size, int) and self.dspark_block_size > 0, "dspark_block_size",
             "a positive int", self.dspark_block_size)
        need(0 <= self.dspark_noise_token_id < self.vocab_size, "dspark_noise_token_id",
             f"an id < vocab_size {self.vocab_size}", self.dspark_noise_token_id)
        ids = self.dspark_target_layer_ids
        need(len(ids) > 0 and all(isinstance(i, int) and 0 <= i < L for i in ids) and len(set(ids)) == len(ids),
             "dspark_target_layer_ids", f"distinct layer ids in 0..{L - 1}", list(ids))
        need(isinstance(self.dspark_markov_rank, int) and self.dspark_markov_rank > 0, "dspark_markov_rank",
             "a positive int", self.dspark_markov_rank)
        need(len(self.mtp_compress_ratios) >= 1 and all(r == 0 for r in self.mtp_compress_ratios),
             "compress_ratios (DSpark stage entries)",
             "one 0 per stage after the main layers (the stages are window-only, dspark.md §2.1)",
             list(self.mtp_compress_ratios))

    @property
    def dspark_stages(self) -> int:
        """Number of DSpark stages (mtp.0..), 0 without DSpark. Counted from the trailing
        compress_ratios entries; num_nextn_predict_layers is vestigial in 0731 (dspark.md §2.1)."""
        return len(self.mtp_compress_ratios) if self.dspark_block_size else 0

    # ---- derived quantities -----------------------------------------------------------------
    @property
    def nope_head_dim(self) -> int:
        return self.head_dim - self.qk_rope_head_dim

    @property
    def hc_mix_dim(self) -> int:
        """(2 + n) * n: pre (n) + post (n) + comb (n*n)."""
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def wo_a_group_in(self) -> int:
        return self.num_attention_heads * self.head_dim // self.o_groups

    def layer_kind(self, layer: int) -> str:
        """'window', 'csa' or 'hca' for main layer ``layer``."""
        r = self.compress_ratios[self._check_layer(layer)]
        return "window" if r == 0 else ("csa" if r == self.csa_ratio else "hca")

    def compress_ratio(self, layer: int) -> int:
        return self.compress_ratios[self._check_layer(layer)]

    def is_hash_layer(self, layer: int) -> bool:
        return self._check_layer(layer) < self.num_hash_layers

    def _check_layer(self, layer: int) -> int:
        if not (isinstance(layer, int) and 0 <= layer < self.num_hidden_layers):
            raise ConfigError(f"config '{self.name}': layer index: expected 0..{self.num_hidden_layers - 1}, "
                              f"found {layer!r}")
        return layer

    def replace(self, **changes: Any) -> "DSV4Config":
        return dataclasses.replace(self, **changes)

    # ---- serialization ----------------------------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """The HF ``config.json`` form (a): what the synthetic checkpoints write."""
        d: dict[str, Any] = {
            "architectures": ["DeepseekV4ForCausalLM"],
            "model_type": "deepseek_v4",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "q_lora_rank": self.q_lora_rank,
            "o_lora_rank": self.o_lora_rank,
            "o_groups": self.o_groups,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "sliding_window": self.sliding_window,
            "compress_ratios": list(self.compress_ratios) + list(self.mtp_compress_ratios),
            "compress_rope_theta": self.compress_rope_theta,
            "rope_theta": self.rope_theta,
            "rope_scaling": {"type": "yarn", "factor": self.rope_factor,
                             "original_max_position_embeddings": self.original_seq_len,
                             "beta_fast": self.beta_fast, "beta_slow": self.beta_slow},
            "max_position_embeddings": self.max_position_embeddings,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hash_layers": self.num_hash_layers,
            "scoring_func": self.scoring_func,
            "topk_method": "noaux_tc",
            "norm_topk_prob": True,
            "routed_scaling_factor": self.routed_scaling_factor,
            "swiglu_limit": self.swiglu_limit,
            "hidden_act": "silu",
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "tie_word_embeddings": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "torch_dtype": "bfloat16",
            "attention_bias": False,
            "expert_dtype": self.expert_dtype,
        }
        # Non-standard ratios cannot be expressed through compress_ratios alone.
        if (self.csa_ratio, self.hca_ratio) != (4, 128):
            d["compress_rates"] = {"compressed_sparse_attention": self.csa_ratio,
                                   "heavily_compressed_attention": self.hca_ratio}
        if self.dspark_block_size:
            d.update(self._dspark_dict())
        if self.dtype == "fp8":
            d["quantization_config"] = dict(self.quantization_config or {
                "quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
        return d

    def _dspark_dict(self) -> dict[str, Any]:
        return {"dspark_block_size": self.dspark_block_size, "dspark_noise_token_id": self.dspark_noise_token_id,
                "dspark_target_layer_ids": list(self.dspark_target_layer_ids),
                "dspark_markov_rank": self.dspark_markov_rank}

    def to_transformers_dict(self) -> dict[str, Any]:
        """The transformers-5.x form (b), as ``DeepseekV4Config(**d)`` accepts it."""
        d = self.to_hf_dict()
        for k in ("compress_ratios", "qk_rope_head_dim", "num_hash_layers", "rope_scaling", "expert_dtype",
                  "quantization_config", "topk_method"):
            d.pop(k, None)
        d["layer_types"] = [_TF_LAYER_TYPE[self.layer_kind(i)] for i in range(self.num_hidden_layers)]
        d["mlp_layer_types"] = ["hash_moe" if self.is_hash_layer(i) else "moe"
                                for i in range(self.num_hidden_layers)]
        d["compress_rates"] = {"compressed_sparse_attention": self.csa_ratio,
                               "heavily_compressed_attention": self.hca_ratio}
        d["partial_rotary_factor"] = self.qk_rope_head_dim / self.head_dim
        d["rope_parameters"] = {
            "main": {"rope_type": "default", "rope_theta": self.rope_theta,
                     "partial_rotary_factor": self.qk_rope_head_dim / self.head_dim},
            "compress": {"rope_type": "yarn", "rope_theta": self.compress_rope_theta,
                         "factor": self.rope_factor, "original_max_position_embeddings": self.original_seq_len,
                         "beta_fast": self.beta_fast, "beta_slow": self.beta_slow, "attention_factor": 1.0,
                         "partial_rotary_factor": self.qk_rope_head_dim / self.head_dim},
        }
        return d

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_hf_dict(), indent=2, sort_keys=True) + "\n")

    # ---- parsing ----------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], name: str = "custom", *,
                  allow_unknown: bool | None = None) -> "DSV4Config":
        """Parse any of the three forms; the form is detected from its keys. An unknown key is an
        error unless ``allow_unknown`` (default: env ``DSV4_ALLOW_UNKNOWN_CONFIG_KEYS``); ignored keys
        are recorded in ``ignored_keys``."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"config '{name}': expected a JSON object, found {type(d).__name__}")
        if "dim" in d and "n_layers" in d:
            c = _from_official(d, name, allow_unknown)
        elif "hidden_size" in d:
            ignored = screen_hf_keys(d, name, allow_unknown, ConfigError)
            if "layer_types" in d or "rope_parameters" in d or "mlp_layer_types" in d:
                c = _from_transformers(d, name)
            else:
                c = _from_hf(d, name)
            c = dataclasses.replace(c, ignored_keys=ignored) if ignored else c
        else:
            raise ConfigError(f"config '{name}': expected an HF config (hidden_size), a transformers-5.x config "
                              f"(layer_types) or an official ModelArgs config (dim, n_layers); found keys "
                              f"{sorted(d)[:12]}")
        return c
        raise ConfigError(f"config '{name}': expected an HF config (hidden_size), a transformers-5.x config "
                          f"(layer_types) or an official ModelArgs config (dim, n_layers); found keys "
                          f"{sorted(d)[:12]}")

    @classmethod
    def from_json(cls, path: str | Path, *, allow_unknown: bool | None = None) -> "DSV4Config":
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p}: expected a file, found nothing") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"config file {p}: expected valid JSON, found a syntax error: {e}") from None
        return cls.from_dict(d, name=p.parent.name or p.name, allow_unknown=allow_unknown)


# ---- form-specific readers ------------------------------------------------------------------------
def _req(d: Mapping[str, Any], key: str, name: str, typ: type | tuple[type, ...] = (int,)) -> Any:
    if key not in d:
        raise ConfigError(f"config '{name}': missing key '{key}'")
    v = d[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if float in types and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, types) or isinstance(v, bool) and bool not in types:
        raise ConfigError(f"config '{name}': key '{key}': expected {'/'.join(t.__name__ for t in types)}, "
                          f"found {v!r}")
    return v


def _opt(d: Mapping[str, Any], key: str, default: Any) -> Any:
    v = d.get(key, default)
    return default if v is None else v


def _split_ratios(ratios: Sequence[int], n_layers: int, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ratios = list(ratios)
    if not all(isinstance(r, int) and not isinstance(r, bool) for r in ratios):
        raise ConfigError(f"config '{name}': compress_ratios: expected ints, found {ratios!r}")
    if len(ratios) < n_layers:
        raise ConfigError(f"config '{name}': compress_ratios: expected >= {n_layers} entries "
                          f"(num layers, + MTP), found {len(ratios)}")
    return tuple(ratios[:n_layers]), tuple(ratios[n_layers:])


def _ratio_pair(ratios: Sequence[int], d: Mapping[str, Any]) -> tuple[int, int]:
    rates = d.get("compress_rates") or {}
    csa = int(rates.get("compressed_sparse_attention", d.get("compress_rate_csa", 4)))
    hca = int(rates.get("heavily_compressed_attention", d.get("compress_rate_hca", 128)))
    nonzero = sorted({r for r in ratios if r})
    if not rates and len(nonzero) == 2:
        csa, hca = nonzero
    return csa, hca


def _common_hf(d: Mapping[str, Any], name: str) -> dict[str, Any]:
    n = _req(d, "num_hidden_layers", name)
    kv = d.get("num_key_value_heads", 1)
    if kv != 1:
        raise ConfigError(f"config '{name}': num_key_value_heads: expected 1 (one shared K=V head), found {kv!r}")
    eos = d.get("eos_token_id", 1)
    if isinstance(eos, list):
        eos = eos[0]
    return dict(
        vocab_size=_req(d, "vocab_size", name), hidden_size=_req(d, "hidden_size", name),
        num_hidden_layers=n, num_attention_heads=_req(d, "num_attention_heads", name),
        head_dim=_req(d, "head_dim", name), q_lora_rank=_req(d, "q_lora_rank", name),
        o_lora_rank=_req(d, "o_lora_rank", name), o_groups=_req(d, "o_groups", name),
        index_n_heads=_req(d, "index_n_heads", name), index_head_dim=_req(d, "index_head_dim", name),
        index_topk=_req(d, "index_topk", name), sliding_window=_req(d, "sliding_window", name),
        rope_theta=float(_opt(d, "rope_theta", 10000.0)),
        compress_rope_theta=float(_opt(d, "compress_rope_theta", 160000.0)),
        max_position_embeddings=int(_opt(d, "max_position_embeddings", 1048576)),
        hc_mult=int(_opt(d, "hc_mult", 4)), hc_sinkhorn_iters=int(_opt(d, "hc_sinkhorn_iters", 20)),
        hc_eps=float(_opt(d, "hc_eps", 1e-6)), rms_norm_eps=float(_opt(d, "rms_norm_eps", 1e-6)),
        n_routed_experts=_req(d, "n_routed_experts", name),
        n_shared_experts=int(_opt(d, "n_shared_experts", 1)),
        num_experts_per_tok=_req(d, "num_experts_per_tok", name),
        moe_intermediate_size=_req(d, "moe_intermediate_size", name),
        scoring_func=str(_opt(d, "scoring_func", "sqrtsoftplus")),
        routed_scaling_factor=float(_req(d, "routed_scaling_factor", name, (float, int))),
        swiglu_limit=float(_req(d, "swiglu_limit", name, (float, int))),
        num_nextn_predict_layers=int(_opt(d, "num_nextn_predict_layers", 1)),
        bos_token_id=int(_opt(d, "bos_token_id", 0)), eos_token_id=int(eos),
        name=name,
    )


def _storage_dtypes(d: Mapping[str, Any]) -> dict[str, Any]:
    q = d.get("quantization_config")
    expert_dtype = d.get("expert_dtype", (q or {}).get("expert_dtype") if isinstance(q, Mapping) else None)
    if q and isinstance(q, Mapping) and q.get("quant_method") == "compressed-tensors":
        dtype, expert_dtype = "bf16", None   # NVFP4 or BF16 per tensor; no FP8 trunk
    elif q:
        dtype = "fp8"
        expert_dtype = expert_dtype or "fp4"
    else:
        dtype = "bf16"
    return dict(dtype=dtype, expert_dtype=expert_dtype, quantization_config=dict(q) if q else None)


# rope types transformers writes that DeepSeek-V4 cannot express: its compressed layers use YaRN or
# nothing (spec §11; OFF-M disables YaRN with original_seq_len 0), its window layers plain RoPE.
_ROPE_REFUSED = ("linear", "dynamic", "longrope", "llama3", "su", "mrope")


def _yarn_from(rs: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    rs = rs or {}
    kind = rs.get("type", rs.get("rope_type", "yarn" if rs else None))
    if kind == "default":   # transformers' "no scaling": YaRN off, as the official original_seq_len=0
        return dict(rope_factor=1.0, original_seq_len=0, beta_fast=32.0, beta_slow=1.0)
    if rs and kind != "yarn":
        why = " (a scaling DeepSeek-V4 does not define)" if kind in _ROPE_REFUSED else ""
        raise ConfigError(f"config '{name}': rope_scaling.type: expected 'yarn' or 'default', found {kind!r}{why}")
    return dict(rope_factor=float(rs.get("factor", 16.0)),
                original_seq_len=int(rs.get("original_max_position_embeddings", 65536)),
                beta_fast=float(rs.get("beta_fast", 32.0)), beta_slow=float(rs.get("beta_slow", 1.0)))


def _dspark_from(d: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The four ``dspark_*`` keys (same names in both config forms, dspark.md §2.1), type-checked."""
    if not d.get("dspark_block_size"):
        return {}
    ids = d.get("dspark_target_layer_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ConfigError(f"config '{name}': key 'dspark_target_layer_ids': expected a list of layer ids, "
                          f"found {ids!r}")
    return dict(dspark_block_size=_req(d, "dspark_block_size", name),
                dspark_noise_token_id=_req(d, "dspark_noise_token_id", name),
                dspark_target_layer_ids=tuple(ids), dspark_markov_rank=_req(d, "dspark_markov_rank", name))


def _from_hf(d: Mapping[str, Any], name: str) -> DSV4Config:
    kw = _common_hf(d, name)
    ratios = _req(d, "compress_ratios", name, list)
    main, mtp = _split_ratios(ratios, kw["num_hidden_layers"], name)
    csa, hca = _ratio_pair(main, d)
    rope_dim = int(_req(d, "qk_rope_head_dim", name))
    return DSV4Config(**kw, qk_rope_head_dim=rope_dim, compress_ratios=main, mtp_compress_ratios=mtp or (0,),
                      csa_ratio=csa, hca_ratio=hca, num_hash_layers=int(_opt(d, "num_hash_layers", 3)),
                      **_yarn_from(d.get("rope_scaling"), name), **_storage_dtypes(d), **_dspark_from(d, name))


def _from_transformers(d: Mapping[str, Any], name: str) -> DSV4Config:
    kw = _common_hf(d, name)
    n = kw["num_hidden_layers"]
    csa, hca = _ratio_pair((), d)
    if "layer_types" in d and d["layer_types"] is not None:
        lt = list(d["layer_types"])
        bad = [t for t in lt if t not in _TF_LAYER_TYPE_INV]
        if bad or len(lt) < n:
            raise ConfigError(f"config '{name}': layer_types: expected {n} entries from "
                              f"{sorted(_TF_LAYER_TYPE_INV)}, found {lt!r}")
        kinds = [_TF_LAYER_TYPE_INV[t] for t in lt[:n]]
        main = tuple(0 if k == "window" else (csa if k == "csa" else hca) for k in kinds)
    elif "compress_ratios" in d:
        main, _ = _split_ratios(d["compress_ratios"], n, name)
    else:  # transformers' default schedule (the Pro pattern): 2x HCA, then alternating
        main = tuple([hca] * min(n, 2) + [csa if i % 2 else hca for i in range(max(n - 2, 0))])
    mlt = d.get("mlp_layer_types")
    if mlt is not None:
        mlt = list(mlt)
        n_hash = sum(1 for t in mlt if t == "hash_moe")
        if mlt[:n_hash] != ["hash_moe"] * n_hash or any(t not in ("hash_moe", "moe") for t in mlt):
            raise ConfigError(f"config '{name}': mlp_layer_types: expected 'hash_moe' entries first, then "
                              f"'moe', found {mlt!r}")
    else:
        n_hash = int(_opt(d, "num_hash_layers", 3))
    if "qk_rope_head_dim" in d:
        rope_dim = int(d["qk_rope_head_dim"])
    else:
        prf = d.get("partial_rotary_factor") or 64 / 512
        rope_dim = int(round(kw["head_dim"] * float(prf)))
    rp = d.get("rope_parameters") or {}
    if "rope_type" in rp or "rope_theta" in rp:   # transformers' flat single-rope form
        rp = {"main": rp, "compress": rp}
    yarn_src = rp.get("compress") if isinstance(rp.get("compress"), Mapping) else d.get("rope_scaling")
    if isinstance(rp.get("main"), Mapping) and "rope_theta" in rp["main"]:
        kw["rope_theta"] = float(rp["main"]["rope_theta"])
    if isinstance(rp.get("compress"), Mapping) and "rope_theta" in rp["compress"]:
        kw["compress_rope_theta"] = float(rp["compress"]["rope_theta"])
    yarn = _yarn_from({k: v for k, v in (yarn_src or {}).items()
                       if k not in ("rope_theta", "partial_rotary_factor", "attention_factor")}, name)
    dspark = _dspark_from(d, name)
    mtp: tuple[int, ...] = (0,)
    if "compress_ratios" in d:
        mtp = _split_ratios(d["compress_ratios"], n, name)[1] or (0,)
    elif dspark:   # transformers truncates the schedule: one window-only stage per target layer (SGLang)
        mtp = (0,) * len(dspark["dspark_target_layer_ids"])
    return DSV4Config(**kw, qk_rope_head_dim=rope_dim, compress_ratios=main, mtp_compress_ratios=mtp,
                      csa_ratio=csa, hca_ratio=hca, num_hash_layers=n_hash, **yarn, **_storage_dtypes(d), **dspark)


_OFFICIAL = {  # ModelArgs name -> DSV4Config field
    "vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads", "head_dim": "head_dim", "rope_head_dim": "qk_rope_head_dim",
    "q_lora_rank": "q_lora_rank", "o_lora_rank": "o_lora_rank", "o_groups": "o_groups",
    "index_n_heads": "index_n_heads", "index_head_dim": "index_head_dim", "index_topk": "index_topk",
    "window_size": "sliding_window", "rope_theta": "rope_theta", "compress_rope_theta": "compress_rope_theta",
    "rope_factor": "rope_factor", "original_seq_len": "original_seq_len", "beta_fast": "beta_fast",
    "beta_slow": "beta_slow", "hc_mult": "hc_mult", "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps", "norm_eps": "rms_norm_eps", "n_routed_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts", "n_activated_experts": "num_experts_per_tok",
    "moe_inter_dim": "moe_intermediate_size", "n_hash_layers": "num_hash_layers", "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor", "swiglu_limit": "swiglu_limit", "n_mtp_layers":
    "num_nextn_predict_layers", "dtype": "dtype", "expert_dtype": "expert_dtype",
}
_OFFICIAL_IGNORED = {"n_routed_experts_score", "scale_fmt", "scale_dtype", "max_batch_size", "max_seq_len",
                     "compress_ratios"}


_OFFICIAL_DSPARK = ("dspark_block_size", "dspark_noise_token_id", "dspark_target_layer_ids", "dspark_markov_rank")


def _from_official(d: Mapping[str, Any], name: str, allow_unknown: bool | None = None) -> DSV4Config:
    unknown = sorted(set(d) - set(_OFFICIAL) - _OFFICIAL_IGNORED - set(_OFFICIAL_DSPARK))
    if unknown and not (allow_unknown_default() if allow_unknown is None else allow_unknown):
        raise ConfigError(f"config '{name}': official ModelArgs config: unexpected keys {unknown} (an unknown key "
                          f"may change the model); set {ALLOW_ENV}=1 to proceed without them (they are recorded "
                          f"in the run's provenance)")
    # Required: the official defaults describe a debug model (spec §1.1 DISAGREE), never rely on them.
    for key in ("vocab_size", "dim", "n_layers", "n_heads", "moe_inter_dim", "n_routed_experts",
                "n_activated_experts", "compress_ratios", "route_scale", "swiglu_limit", "compress_rope_theta",
                "rope_factor", "original_seq_len"):
        if key not in d:
            raise ConfigError(f"config '{name}': official ModelArgs config: missing key '{key}'")
    kw: dict[str, Any] = {_OFFICIAL[k]: v for k, v in d.items() if k in _OFFICIAL}
    n = int(d["n_layers"])
    main, mtp = _split_ratios(d["compress_ratios"], n, name)
    dspark = _dspark_from(d, name)
    if dspark:   # n_mtp_layers counts the DSpark stages here; it must match the trailing ratios
        stages = int(d.get("n_mtp_layers", 1))
        if stages != len(mtp):
            raise ConfigError(f"config '{name}': n_mtp_layers: expected {len(mtp)} (one per trailing "
                              f"compress_ratios entry, the DSpark stages), found {stages}")
        kw.update(dspark, num_nextn_predict_layers=1)
    csa, hca = _ratio_pair(main, d)
    for k in ("rope_theta", "compress_rope_theta", "rope_factor", "beta_fast", "beta_slow", "hc_eps",
              "rms_norm_eps", "routed_scaling_factor", "swiglu_limit"):
        if k in kw:
            kw[k] = float(kw[k])
    kw.setdefault("n_shared_experts", 1)
    kw.setdefault("num_hash_layers", 0)
    if kw.get("dtype") == "fp8" and "expert_dtype" not in kw:
        kw["expert_dtype"] = "fp4"
    if kw.get("dtype", "fp8") == "bf16":
        kw.setdefault("expert_dtype", None)
    return DSV4Config(**kw, name=name, compress_ratios=main, mtp_compress_ratios=mtp or (0,),
                      csa_ratio=csa, hca_ratio=hca, ignored_keys=tuple(unknown))


# ---- presets --------------------------------------------------------------------------------------
def _flash() -> DSV4Config:
    return DSV4Config(name="flash", compress_ratios=(0, 0) + (4, 128) * 20 + (4,))


def _pro() -> DSV4Config:
    return DSV4Config(
        name="pro", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, q_lora_rank=1536,
        o_groups=16, index_topk=1024, n_routed_experts=384, moe_intermediate_size=3072,
        routed_scaling_factor=2.5, compress_ratios=(128, 128) + (4, 128) * 29 + (4,))


def _tiny(name: str = "tiny", **over: Any) -> DSV4Config:
    # Every layer kind inside the standard prompts: window (0), CSA (4) with index_topk below the
    # number of entries, HCA (16) with >= 2 entries; hash-routed layers 0-1, score-routed 2-3.
    # head_dim - rope = 64, index_head_dim = 128 (power of two, Hadamard 128), linear dims are
    # multiples of 128 (FP8 128x128 blocks) with non-square block grids. Spec §14.
    base = dict(
        name=name, vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, head_dim=128,
        qk_rope_head_dim=64, q_lora_rank=128, o_lora_rank=128, o_groups=2, index_n_heads=4,
        index_head_dim=128, index_topk=4, sliding_window=16, compress_ratios=(0, 4, 16, 4),
        csa_ratio=4, hca_ratio=16, max_position_embeddings=1024, hc_mult=4, hc_sinkhorn_iters=20,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, num_hash_layers=2,
        # swiglu_limit 2 (not the real 10): sigma(10) ~ 1, so at 10 the clamp-order bugs (clamping
        # silu(gate), or sigmoid of the unclamped gate) change outputs by ~1e-4 and stay invisible.
        routed_scaling_factor=1.5, swiglu_limit=2.0, num_nextn_predict_layers=1,
    )
    base.update(over)
    return DSV4Config(**base)


PRESETS = {
    "flash": _flash,
    "pro": _pro,
    "tiny": _tiny,
    # A deeper tiny model: more layers for localization and streaming studies.
    "tiny-deep": lambda: _tiny("tiny-deep", num_hidden_layers=8, compress_ratios=(0, 4, 16, 4, 16, 4, 16, 4)),
    # The trained tiny model shipped in dsv4/data/models (dsv4.checkpoint.builtin): its config.
    "tiny-trained": lambda: _trained_config("tiny-trained"),
    # The tiny model with a DSpark draft (three window-only stages after its four layers; random
    # weights): the synthetic 0731 flavor that draft parity runs on (docs/dspark.md).
    "tiny-dspark": lambda: with_dspark(_tiny()),
    # The trained tiny model in its 0731 form with a trained draft (dsv4.checkpoint.builtin): the
    # default of draft parity (docs/trained-model.md).
    "tiny-trained-dspark": lambda: _trained_config("tiny-trained-dspark"),
    # The July/August releases with their DSpark draft (config-only, like flash and pro).
    "flash-0731": lambda: with_dspark(_flash()),
    "pro-0813": lambda: with_dspark(_pro()),
}
REAL_PRESETS = ("flash", "pro", "flash-0731", "pro-0813")


def _trained_config(name: str) -> DSV4Config:
    from .checkpoint.builtin import trained_path

    return DSV4Config.from_json(trained_path(name) / "config.json")


# The 0731/0813 DSpark keys of the real releases (dspark.md §2.1); other sizes get the same shape:
# the last three layers as targets, a Markov rank of a quarter of the width.
_DSPARK_REAL = {"flash": ((40, 41, 42), 256), "pro": ((58, 59, 60), 512)}


def with_dspark(c: DSV4Config, stages: int = 3, block_size: int = 5) -> DSV4Config:
    """The DSpark (0731/0813) form of a config: three window-only stages after the main layers."""
    base = c.name.split("-")[0]
    ids, rank = _DSPARK_REAL.get(base, (tuple(range(max(c.num_hidden_layers - stages, 0), c.num_hidden_layers)),
                                        max(c.hidden_size // 4, 1)))
    noise = 128799 if c.vocab_size > 128799 else c.vocab_size - 1
    suffix = {"flash": "flash-0731", "pro": "pro-0813"}.get(c.name, f"{c.name}-dspark")
    return c.replace(name=suffix, dspark_block_size=block_size, dspark_noise_token_id=noise,
                     dspark_target_layer_ids=ids, dspark_markov_rank=rank, mtp_compress_ratios=(0,) * stages)


def preset(name: str) -> DSV4Config:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown preset: expected one of {sorted(PRESETS)}, found {name!r}") from None


def load_config(path_or_preset: str | Path) -> DSV4Config:
    """A preset name, a config.json path, or a directory holding config.json."""
    s = str(path_or_preset)
    if s in PRESETS:
        return preset(s)
    p = Path(s)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise ConfigError(f"config: expected a preset ({sorted(PRESETS)}), a config.json or a directory holding "
                          f"one, found {s!r}")
    return DSV4Config.from_json(p)


# ---- input validation shared by both model surfaces (compute-free) --------------------------------
def check_token_ids(config: DSV4Config, ids: Any) -> None:
    """Raise ValueError naming what is wrong with a prompt before any compute."""
    import torch

    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"input_ids: expected a torch integer tensor, found {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise ValueError(f"input_ids: expected an integer dtype, found {ids.dtype}")
    if ids.dim() not in (1, 2):
        raise ValueError(f"input_ids: expected shape [T] or [B, T], found {tuple(ids.shape)}")
    if ids.shape[-1] == 0:
        raise ValueError("input_ids: expected at least one token, found an empty prompt")
    if ids.shape[-1] > config.max_position_embeddings:
        raise ValueError(f"input_ids: expected at most max_position_embeddings={config.max_position_embeddings} "
                         f"tokens, found {ids.shape[-1]}")
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= config.vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"input_ids: expected ids in [0, {config.vocab_size}), found {bad}")


def check_device_map(config: DSV4Config, device_map: Mapping[Any, str] | None) -> dict[Any, str]:
    """Validate ``{layer index | 'embed' | 'head': device}``; every device must exist. Returns a full map."""
    import torch

    if device_map is None:
        return {}
    out: dict[Any, str] = {}
    for key, dev in device_map.items():
        if not (key in ("embed", "head") or (isinstance(key, int) and 0 <= key < config.num_hidden_layers)):
            raise ValueError(f"device_map key: expected a layer index 0..{config.num_hidden_layers - 1}, "
                             f"'embed' or 'head', found {key!r}")
        try:
            d = torch.device(dev)
        except (RuntimeError, TypeError):
            raise ValueError(f"device_map[{key!r}]: expected a device string, found {dev!r}") from None
        if d.type == "cuda":
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            idx = d.index or 0
            if idx >= count:
                raise ValueError(f"device_map[{key!r}]: expected an existing device (this machine has {count} "
                                 f"CUDA device(s)), found {dev!r}")
        elif d.type not in ("cpu", "meta"):
            raise ValueError(f"device_map[{key!r}]: expected a 'cpu' or 'cuda[:N]' device, found {dev!r}")
        out[key] = str(d)
    return out


def layer_devices(config: DSV4Config, device: str, device_map: Mapping[Any, str] | None) -> dict[Any, str]:
    """Resolve the device of every layer, 'embed' and 'head' (missing keys take ``device``)."""
    m = check_device_map(config, device_map)
    keys: list[Any] = ["embed", *range(config.num_hidden_layers), "head"]
    return {k: m.get(k, str(device)) for k in keys}
