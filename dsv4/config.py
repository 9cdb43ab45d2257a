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
from typing import Any, Mapping

from .config_keys import ALLOW_ENV, TF_LAYER_TYPE, ConfigError, screen_hf_keys

__all__ = ["ALLOW_ENV", "ConfigError", "DSV4Config", "LAYER_KINDS", "PRESETS", "REAL_PRESETS", "check_device_map",
           "check_token_ids", "layer_devices", "load_config", "preset", "with_dspark"]


LAYER_KINDS = ("window", "csa", "hca")


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
        d["layer_types"] = [TF_LAYER_TYPE[self.layer_kind(i)] for i in range(self.num_hidden_layers)]
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
        from .config_forms import _from_hf, _from_official, _from_transformers

        if not isinstance(d, Mapping):
            raise ConfigError(f"config '{name}': expected a JSON object, found {type(d).__name__}")
        if "dim" in d and "n_layers" in d:
            c = cls(**_from_official(d, name, allow_unknown))
        elif "hidden_size" in d:
            ignored = screen_hf_keys(d, name, allow_unknown, ConfigError)
            if "layer_types" in d or "rope_parameters" in d or "mlp_layer_types" in d:
                c = cls(**_from_transformers(d, name))
            else:
                c = cls(**_from_hf(d, name))
            c = dataclasses.replace(c, ignored_keys=ignored) if ignored else c
        else:
            raise ConfigError(f"config '{name}': expected an HF config (hidden_size), a transformers-5.x config "
                              f"(layer_types) or an official ModelArgs config (dim, n_layers); found keys "
                              f"{sorted(d)[:12]}")
        return c

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
