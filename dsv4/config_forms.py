"""The three config forms' readers (spec dsv4-architecture.md §1): each turns its form's mapping into the
fields of a ``DSV4Config`` (a dict: this module does not import ``dsv4.config``, which imports it).
``DSV4Config.from_dict`` picks the reader from the form's keys; nothing else calls these.

Compute-free, like :mod:`dsv4.config`: the reference may import it.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .config_keys import ALLOW_ENV, TF_LAYER_TYPE_INV, ConfigError, allow_unknown_default


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


def _from_hf(d: Mapping[str, Any], name: str) -> dict[str, Any]:
    kw = _common_hf(d, name)
    ratios = _req(d, "compress_ratios", name, list)
    main, mtp = _split_ratios(ratios, kw["num_hidden_layers"], name)
    csa, hca = _ratio_pair(main, d)
    rope_dim = int(_req(d, "qk_rope_head_dim", name))
    return dict(**kw, qk_rope_head_dim=rope_dim, compress_ratios=main, mtp_compress_ratios=mtp or (0,),
                      csa_ratio=csa, hca_ratio=hca, num_hash_layers=int(_opt(d, "num_hash_layers", 3)),
                      **_yarn_from(d.get("rope_scaling"), name), **_storage_dtypes(d), **_dspark_from(d, name))


def _from_transformers(d: Mapping[str, Any], name: str) -> dict[str, Any]:
    kw = _common_hf(d, name)
    n = kw["num_hidden_layers"]
    csa, hca = _ratio_pair((), d)
    if "layer_types" in d and d["layer_types"] is not None:
        lt = list(d["layer_types"])
        bad = [t for t in lt if t not in TF_LAYER_TYPE_INV]
        if bad or len(lt) < n:
            raise ConfigError(f"config '{name}': layer_types: expected {n} entries from "
                              f"{sorted(TF_LAYER_TYPE_INV)}, found {lt!r}")
        kinds = [TF_LAYER_TYPE_INV[t] for t in lt[:n]]
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
    return dict(**kw, qk_rope_head_dim=rope_dim, compress_ratios=main, mtp_compress_ratios=mtp,
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


def _from_official(d: Mapping[str, Any], name: str, allow_unknown: bool | None = None) -> dict[str, Any]:
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
    return dict(**kw, name=name, compress_ratios=main, mtp_compress_ratios=mtp or (0,),
                      csa_ratio=csa, hca_ratio=hca, ignored_keys=tuple(unknown))

