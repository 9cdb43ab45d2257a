"""The expected tensor set of a DeepSeek-V4 checkpoint, by canonical (official) names.

Canonical names are the official names of spec §2.1-§2.2 without the ``layers.{i}.`` prefix and
without a ``.weight`` suffix: ``attn.wq_a``, ``ffn.experts.3.w1``, ``attn.attn_sink``; global ones
are ``embed``, ``head``, ``norm``, ``hc_head_fn``, ... MTP tensors are ``mtp.0.<name>``.

Each flavor maps canonical names to stored names (``stored_prefix``); the tables below say what
shape each weight has logically, independent of how it is stored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..config import DSV4Config

# kinds of weights: a quantizable linear [out, in]; a norm / 1-d weight; a raw fp32 parameter;
# the int64 hash table; the dense embed/head tables.
LINEAR, NORM, PARAM, INDEX, TABLE = "linear", "norm", "param", "index", "table"


@dataclass(frozen=True)
class WeightSpec:
    name: str                  # canonical name without the layer prefix
    layer: int | None          # main layer index, None for global tensors
    shape: tuple[int, ...]     # logical shape
    kind: str                  # LINEAR / NORM / PARAM / INDEX / TABLE
    mtp: int | None = None     # MTP block index for mtp.* tensors

    @property
    def full_name(self) -> str:
        """The official stored base name (``layers.3.attn.wq_a``, ``mtp.0.e_proj``, ``embed``)."""
        if self.mtp is not None:
            return f"mtp.{self.mtp}.{self.name}"
        return self.name if self.layer is None else f"layers.{self.layer}.{self.name}"

    @property
    def is_expert(self) -> bool:
        return self.name.startswith("ffn.experts.")


def _block(c: DSV4Config, layer: int | None, mtp: int | None, ratio: int, hash_layer: bool) -> list[WeightSpec]:
    D, H, d = c.hidden_size, c.num_attention_heads, c.head_dim
    E, I = c.n_routed_experts, c.moe_intermediate_size
    mix, flat = c.hc_mix_dim, c.hc_mult * c.hidden_size

    def w(name: str, shape: tuple[int, ...], kind: str) -> WeightSpec:
        return WeightSpec(name, layer, shape, kind, mtp)

    out = [
        w("attn_norm", (D,), NORM), w("ffn_norm", (D,), NORM),
        w("hc_attn_fn", (mix, flat), PARAM), w("hc_attn_base", (mix,), PARAM), w("hc_attn_scale", (3,), PARAM),
        w("hc_ffn_fn", (mix, flat), PARAM), w("hc_ffn_base", (mix,), PARAM), w("hc_ffn_scale", (3,), PARAM),
        w("attn.wq_a", (c.q_lora_rank, D), LINEAR), w("attn.q_norm", (c.q_lora_rank,), NORM),
        w("attn.wq_b", (H * d, c.q_lora_rank), LINEAR),
        w("attn.wkv", (d, D), LINEAR), w("attn.kv_norm", (d,), NORM),
        w("attn.wo_a", (c.o_groups * c.o_lora_rank, c.wo_a_group_in), LINEAR),
        w("attn.wo_b", (D, c.o_groups * c.o_lora_rank), LINEAR),
        w("attn.attn_sink", (H,), PARAM),
    ]
    if ratio:
        k = 2 if ratio == c.csa_ratio else 1   # CSA compresses with overlapping halves
        out += [w("attn.compressor.wkv", (k * d, D), LINEAR), w("attn.compressor.wgate", (k * d, D), LINEAR),
                w("attn.compressor.ape", (ratio, k * d), PARAM), w("attn.compressor.norm", (d,), NORM)]
    if ratio == c.csa_ratio:
        di, Hi = c.index_head_dim, c.index_n_heads
        out += [w("attn.indexer.wq_b", (Hi * di, c.q_lora_rank), LINEAR),
                w("attn.indexer.weights_proj", (Hi, D), LINEAR),
                w("attn.indexer.compressor.wkv", (2 * di, D), LINEAR),
                w("attn.indexer.compressor.wgate", (2 * di, D), LINEAR),
                w("attn.indexer.compressor.ape", (ratio, 2 * di), PARAM),
                w("attn.indexer.compressor.norm", (di,), NORM)]
    out.append(w("ffn.gate", (E, D), LINEAR))
    out.append(w("ffn.gate.tid2eid", (c.vocab_size, c.num_experts_per_tok), INDEX) if hash_layer
               else w("ffn.gate.bias", (E,), PARAM))
    for e in range(E):
        out += [w(f"ffn.experts.{e}.w1", (I, D), LINEAR), w(f"ffn.experts.{e}.w3", (I, D), LINEAR),
                w(f"ffn.experts.{e}.w2", (D, I), LINEAR)]
    out += [w("ffn.shared_experts.w1", (I, D), LINEAR), w("ffn.shared_experts.w3", (I, D), LINEAR),
            w("ffn.shared_experts.w2", (D, I), LINEAR)]
    return out


def layer_weights(c: DSV4Config, layer: int) -> list[WeightSpec]:
    return _block(c, layer, None, c.compress_ratio(layer), c.is_hash_layer(layer))


def global_weights(c: DSV4Config) -> list[WeightSpec]:
    D, V, n = c.hidden_size, c.vocab_size, c.hc_mult
    return [WeightSpec("embed", None, (V, D), TABLE), WeightSpec("head", None, (V, D), TABLE),
            WeightSpec("norm", None, (D,), NORM), WeightSpec("hc_head_fn", None, (n, n * D), PARAM),
            WeightSpec("hc_head_base", None, (n,), PARAM), WeightSpec("hc_head_scale", None, (1,), PARAM)]


def mtp_weights(c: DSV4Config, index: int = 0) -> list[WeightSpec]:
    D, n = c.hidden_size, c.hc_mult
    ratio = c.mtp_compress_ratios[index] if index < len(c.mtp_compress_ratios) else 0
    extra = [WeightSpec("e_proj", None, (D, D), LINEAR, index), WeightSpec("h_proj", None, (D, D), LINEAR, index),
             WeightSpec("enorm", None, (D,), NORM, index), WeightSpec("hnorm", None, (D,), NORM, index),
             WeightSpec("norm", None, (D,), NORM, index),
             WeightSpec("hc_head_fn", None, (n, n * D), PARAM, index),
             WeightSpec("hc_head_base", None, (n,), PARAM, index),
             WeightSpec("hc_head_scale", None, (1,), PARAM, index)]
    return extra + _block(c, None, index, ratio, hash_layer=False)


def dspark_weights(c: DSV4Config, stage: int) -> list[WeightSpec]:
    """One DSpark stage ``mtp.{stage}`` of the 0731/0813 releases (dspark.md §3.1): a window-only,
    score-routed block; stage 0 adds ``main_proj``/``main_norm`` (joining the target layers' hidden
    states), the last stage the drafter's own final norm and hc head, the Markov head and the
    confidence head. No ``e_proj``/``h_proj``/``enorm``/``hnorm``; embed and head are the trunk's."""
    D, n, V, r = c.hidden_size, c.hc_mult, c.vocab_size, c.dspark_markov_rank
    extra: list[WeightSpec] = []
    if stage == 0:
        extra += [WeightSpec("main_proj", None, (D, len(c.dspark_target_layer_ids) * D), LINEAR, stage),
                  WeightSpec("main_norm", None, (D,), NORM, stage)]
    if stage == c.dspark_stages - 1:
        extra += [WeightSpec("norm", None, (D,), NORM, stage),
                  WeightSpec("hc_head_fn", None, (n, n * D), PARAM, stage),
                  WeightSpec("hc_head_base", None, (n,), PARAM, stage),
                  WeightSpec("hc_head_scale", None, (1,), PARAM, stage),
                  WeightSpec("markov_head.markov_w1", None, (V, r), TABLE, stage),
                  WeightSpec("markov_head.markov_w2", None, (V, r), TABLE, stage),
                  WeightSpec("confidence_head.proj", None, (1, D + r), TABLE, stage)]
    return extra + _block(c, None, stage, c.mtp_compress_ratios[stage], hash_layer=False)


def draft_weights(c: DSV4Config) -> list[WeightSpec]:
    """Every ``mtp.*`` weight the config implies: DSpark stages when ``dspark_block_size`` is set,
    else the April NextN block(s)."""
    if c.dspark_block_size:
        return [s for j in range(c.dspark_stages) for s in dspark_weights(c, j)]
    return [s for j in range(c.num_nextn_predict_layers) for s in mtp_weights(c, j)]


def all_weights(c: DSV4Config, *, mtp: bool = False) -> Iterator[WeightSpec]:
    yield from global_weights(c)
    for i in range(c.num_hidden_layers):
        yield from layer_weights(c, i)
    if mtp:
        yield from draft_weights(c)


def spec_index(c: DSV4Config, *, mtp: bool = False) -> dict[str, WeightSpec]:
    """full_name -> spec."""
    return {s.full_name: s for s in all_weights(c, mtp=mtp)}


# ---- plan component class of a weight (used by the native side and the flip tables) -----------------
def component_class(name: str) -> str | None:
    """The precision-plan class of a canonical linear name (None: not a planned weight)."""
    if name == "head":
        return "lm_head"
    if name == "ffn.gate":
        return "router"
    if name.startswith("ffn.shared_experts."):
        return "shared_expert"
    if name.startswith("ffn.experts."):
        return "routed_experts"
    if name in ("attn.wq_a", "attn.wq_b"):
        return "attn_q"
    if name == "attn.wkv":
        return "attn_kv"
    if name in ("attn.wo_a", "attn.wo_b"):
        return "attn_o"
    if name.startswith("attn.compressor.") or name.startswith("attn.indexer.compressor."):
        return "compressor" if name.endswith(("wkv", "wgate")) else None
    if name == "attn.indexer.wq_b":
        return "indexer_q"
    if name == "attn.indexer.weights_proj":
        return "indexer_weights"
    return None
