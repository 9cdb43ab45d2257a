"""One draft call compared between an anchor side and a test side (docs/dspark.md, parity):

Both targets prefill the prompt and commit it into their drafts' rings (**propagated**: each draft
its own target's main_hidden; **isolated**: the test draft the anchor's, so a draft bug is not
mixed with a target bug). Both drafts then draft from the same anchor token (the anchor target's
greedy next token) with the same Markov chain (the anchor draft's tokens, teacher forced), so every
row compares like with like. Measured:

* each probe of the join, the rings and the stages (``dspark.main_hidden``, ``dspark.join``,
  ``layers.{L+s}.*``) and the head (``dspark.hc_head``): rel_diff (squared relative L2, as
  everywhere in parity) and cosine;
* per block row, the draft logits before (``dspark.base_logits``) and after (``dspark.logits``) the
  Markov correction: KL(anchor || test) in nats, top-1 agreement (a row whose anchor top-2 margin is
  below the near-tie threshold is marked ``near_tie`` and forgiven), top-5 overlap;
* per row the confidence: |Δ| of the raw logits;
* each stage's expert choice: the share of block rows whose expert set agrees, a row whose set
  flipped at a near tie of the anchor's selection scores (relative cut margin below ``router_tie``,
  parity.selection) counted as agreeing and left out of the probes after the choice in that stage
  (router weights, routed experts, ffn and stage output: per-row functions of the row's choice),
  as the trunk's isolated comparison does. Later stages see the flip (their attention mixes rows).
  Router weights are compared per expert id ([rows, experts], zero where unchosen): the top-k order
  of two equal sets may differ, and position-wise they would compare different experts. In the floor
  column (``common_experts``) only the experts both sides chose count, the routed-weight error "on the
  common experts" of parity-methods §6: there a flip with a clear margin is quantization, judged once
  by the stage's selection rate; counted again in the weights, one flip among a block's few rows moved
  the weights' error past its bound on a CPU type outside the calibration (2 flips of 5 rows, 0.10
  against 0.084)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from dsv4.probes import DRAFT_LAYER_PROBES, DRAFT_PROBES, LAYER_PROBES, ProbeRecorder, draft_class

from ..metrics import cosine, rel_diff
from ..selection import router_tie_flips
from .sides import Side

ROW_PROBES = ("dspark.base_logits", "dspark.logits")
TOPK = 5
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_SUFFIX_CLASS = {**dict(LAYER_PROBES), **dict(DRAFT_LAYER_PROBES)}
_GLOBAL_CLASS = dict(DRAFT_PROBES)
AFTER_CHOICE = ("ffn.router.weights", "ffn.routed.out", "ffn.out", "out")   # per-row functions of the choice
RouterBias = Callable[[int], "torch.Tensor | None"]   # stage -> its selection-only bias


@dataclass
class DraftCapture:
    """What one side produced for one prompt: the probes of its commit and of one draft call."""

    anchor_token: int
    tokens: list[int]
    main_hidden: torch.Tensor
    probes: dict[str, torch.Tensor]


def where_of(name: str, n_layers: int) -> tuple[str, str]:
    """(place, plan or localization class) of a draft probe: place ``stage s`` / ``join`` / ``head``."""
    m = _LAYER.match(name)
    if m:
        return f"stage {int(m.group(1)) - n_layers}", draft_class(_SUFFIX_CLASS.get(m.group(2), "mhc"))
    place = {"dspark.main_hidden": "target capture", "dspark.join": "join"}.get(name, "head")
    return place, _GLOBAL_CLASS.get(name, "mhc")


def probe_order(n_layers: int, stages: int) -> list[str]:
    """Every draft probe in execution order (the first failing one localizes a fault)."""
    names = ["dspark.main_hidden", "dspark.join"]
    names += [f"layers.{n_layers + s}.attn.context_kv" for s in range(stages)]
    for s in range(stages):
        names += [f"layers.{n_layers + s}.{suffix}" for suffix, _ in LAYER_PROBES
                  if suffix != "attn.compressed_kv" and not suffix.startswith("attn.indexer.")]
    return names + ["dspark.hc_head", "dspark.base_logits", "dspark.logits", "dspark.confidence"]


def _include(n_layers: int) -> Any:
    return lambda name: name.startswith("dspark.") or (
        (m := _LAYER.match(name)) is not None and int(m.group(1)) >= n_layers)


@torch.no_grad()
def capture(side: Side, prompt: torch.Tensor, *, main_hidden: torch.Tensor | None = None,
            anchor_token: int | None = None, forced: list[int] | None = None) -> DraftCapture:
    """Prefill ``prompt`` on ``side``'s target, commit ``main_hidden`` (default: its own) into its
    draft's rings and draft once from ``anchor_token`` (default: its own greedy next token)."""
    L = _config(side).num_hidden_layers
    with ProbeRecorder(include=_include(L), to_cpu=True) as rec:
        logits, own, _ = side.start(prompt)
        mh = own if main_hidden is None else main_hidden
        ds = side.dspark.new_state()
        side.commit(ds, mh)
        a = int(torch.argmax(logits[-1])) if anchor_token is None else anchor_token
        d = side.dspark.draft(ds, a, forced=forced)
    return DraftCapture(a, d.tokens, own.detach().to("cpu"), dict(rec.values))


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.double(), dim=-1)


def row_metrics(a: torch.Tensor, b: torch.Tensor, near_tie: float) -> Iterator[tuple[int, str, float]]:
    """Per row r of [γ, V] logits: kl, top1_agree, near_tie (1/0), topk_overlap."""
    la, lb = _softmax(a), _softmax(b)
    kl = (la.exp() * (la - lb)).sum(dim=-1)
    top_a, top_b = torch.topk(a.double(), TOPK, dim=-1).indices, torch.topk(b.double(), TOPK, dim=-1).indices
    two = torch.topk(la, 2, dim=-1).values
    for r in range(a.shape[0]):
        yield r, "kl", float(kl[r])
        yield r, "top1_agree", float(top_a[r, 0] == top_b[r, 0])
        yield r, "near_tie", float(two[r, 0] - two[r, 1] < near_tie)
        yield r, "topk_overlap", len(set(top_a[r].tolist()) & set(top_b[r].tolist())) / TOPK


def _expert_sets_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)


def _chosen(ids: torch.Tensor, n: int) -> torch.Tensor:
    """[rows, k] expert ids -> [rows, n] bool: which experts each row chose."""
    return torch.zeros(ids.shape[0], n, dtype=torch.bool).scatter_(1, ids.to(torch.int64), True)


def _by_expert(ids: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    """[rows, k] weights of [rows, k] expert ids -> [rows, n] (the top-k order dropped)."""
    out = torch.zeros(ids.shape[0], n, dtype=torch.float64)
    return out.scatter_add_(1, ids.to(torch.int64), w.double())


def compare_captures(anchor: DraftCapture, test: DraftCapture, *, n_layers: int, stages: int,
                     near_tie: float, router_tie: float = 0.0,
                     router_bias: RouterBias | None = None, common_experts: bool = False) -> list[dict[str, Any]]:
    """Rows ``{probe, place, component, row, metric, value}`` (row -1: the whole tensor).
    ``router_tie`` 0 forgives no flip (logic: exact); ``router_bias(stage)`` the anchor's bias;
    ``common_experts``: router weights on the experts both sides chose (the floor column)."""
    out: list[dict[str, Any]] = []
    tied: dict[int, torch.Tensor] = {}   # stage layer -> block rows whose choice flipped at a near tie
    n_experts = None

    def add(probe: str, row: int, metric: str, value: float) -> None:
        place, comp = where_of(probe, n_layers)
        out.append({"probe": probe, "place": place, "component": comp, "row": row, "metric": metric, "value": value})

    for name in probe_order(n_layers, stages):
        if name not in anchor.probes or name not in test.probes:
            continue
        a, b = anchor.probes[name], test.probes[name]
        if tuple(a.shape) != tuple(b.shape):
            add(name, -1, "shape_mismatch", 1.0)
            continue
        if not torch.isfinite(b.float()).all():
            add(name, -1, "nonfinite", 1.0)
            continue
        m = _LAYER.match(name)
        if name.endswith("topk_ids"):
            layer = int(m.group(1)) if m else -1
            a_logits = anchor.probes.get(name.replace("topk_ids", "logits"))
            ties = torch.zeros(a.shape[0], dtype=torch.bool)
            if router_tie > 0 and a_logits is not None and m:
                bias = router_bias(layer - n_layers) if router_bias is not None else None
                ties = router_tie_flips(a, b, a_logits, bias, router_tie)
            tied[layer] = ties
            if a_logits is not None:
                n_experts = int(a_logits.shape[-1])
            add(name, -1, "selection_agree", float((~_expert_sets_differ(a, b) | ties).double().mean()))
            continue
        if m and m.group(2) == "ffn.router.weights":
            ids = name.replace("weights", "topk_ids")
            ia, ib = anchor.probes.get(ids), test.probes.get(ids)
            if ia is not None and ib is not None and ia.shape == a.shape == ib.shape and ia.numel() \
                    and int(min(ia.min(), ib.min())) >= 0:
                n = max(n_experts or 0, int(max(ia.max(), ib.max())) + 1)
                a, b = _by_expert(ia, a, n), _by_expert(ib, b, n)
                if common_experts:
                    both = _chosen(ia, n) & _chosen(ib, n)
                    a, b = a * both, b * both
        if m and m.group(2) in AFTER_CHOICE and int(m.group(1)) in tied and bool(tied[int(m.group(1))].any()):
            keep = ~tied[int(m.group(1))]
            if not bool(keep.any()):
                continue
            a, b = a[keep], b[keep]
        if name == "dspark.confidence":
            for r in range(a.shape[0]):
                add(name, r, "abs_diff", float((a[r].double() - b[r].double()).abs()))
            continue
        add(name, -1, "rel_diff", rel_diff(a, b))
        add(name, -1, "cosine", cosine(a, b))
        if name in ROW_PROBES:
            for r, metric, v in row_metrics(a, b, near_tie):
                add(name, r, metric, v)
    return out


def _config(side: Side) -> Any:
    d = side.dspark
    return d.config if hasattr(d, "config") else d.c
