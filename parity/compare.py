"""Per-probe comparison of two models' probe outputs, as records (docs/methods.md §3, §4, §6).

Both modes produce the same records; they differ only in how the test side's probes were obtained
(:mod:`parity.runner`): *propagated* (both models ran freely on the prompt) or *isolated* (each test
layer ``i`` was fed the anchor's input to that layer). Float probes get the tensor metrics of
:mod:`parity.metrics`; selection probes (router / indexer top-k) the agreement metrics of
:mod:`parity.selection`; compressed-entry probes also their entry counts; ``logits`` also the
first-token statistics of :mod:`parity.logits_stats`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from dsv4.config import DSV4Config
from dsv4.probes import layer_probe, parse_probe

from .errors import SurfaceError

log = logging.getLogger(__name__)
from .logits_stats import DEFAULT_NEAR_TIE, DEFAULT_TOPK, PositionStats, at_position, position_stats, \
    teacher_forced_targets
from .metrics import ShapeMismatchError, compare_tensors
from .records import RunContext
from .selection import DEFAULT_INDEXER_TIE, DEFAULT_ROUTER_TIE, entry_agreement, indexer_agreement, \
    indexer_tie_flips, router_agreement, router_tie_flips

ENTRY_SUFFIXES = ("attn.compressed_kv", "attn.indexer.k")
RouterBias = Callable[[int], "torch.Tensor | None"]


class ProbeMismatchError(SurfaceError):
    """The test side lacks a probe the anchor emitted, or a probe's shape differs between sides."""


@dataclass(frozen=True)
class CompareSettings:
    near_tie: float = DEFAULT_NEAR_TIE
    router_tie: float = DEFAULT_ROUTER_TIE
    indexer_tie: float = DEFAULT_INDEXER_TIE
    topk: int = DEFAULT_TOPK
    per_token: bool = False   # also write one rel_diff record per token (position) for every float probe


@dataclass(frozen=True)
class Where:
    """Which record slot a comparison fills (everything but the probe, metric and value)."""

    ctx: RunContext
    pair: str
    compare_mode: str
    prompt_id: str
    prompt_mode: str

    def rec(self, probe: str, metric: str, value: float, position: int | None = None) -> dict[str, Any]:
        return self.ctx.record(prompt_id=self.prompt_id, prompt_mode=self.prompt_mode, pair=self.pair,
                               compare_mode=self.compare_mode, probe=probe, metric=metric, value=value,
                               position=position)


def _float_records(w: Where, name: str, a: torch.Tensor, b: torch.Tensor, s: CompareSettings,
                   tie_rows: np.ndarray | None = None, device: str | torch.device | None = None) -> list[dict]:
    if a.numel() == 0:
        return []
    try:
        c = compare_tensors(a, b, device)
    except ShapeMismatchError as e:
        raise ProbeMismatchError(f"probe {name!r}: {e}") from None
    scalars = c.scalars()
    out = [w.rec(name, m, v) for m, v in scalars.items() if m not in ("cosine_tok_min", "rel_diff_tok_max")]
    if tie_rows is not None and c.rows == len(tie_rows):
        cos, rd = c.without_rows(tie_rows)
        out += [w.rec(name, "cosine_untied", cos), w.rec(name, "rel_diff_untied", rd)]
    if c.rows:
        # Worst-token summaries carry the worst token's position, so a heatmap can start from there.
        out.append(w.rec(name, "cosine_tok_min", scalars["cosine_tok_min"], c.lowest_cosine_token()))
        out.append(w.rec(name, "rel_diff_tok_max", scalars["rel_diff_tok_max"], c.worst_token()))
        if s.per_token:
            out += [w.rec(name, "rel_diff", float(v), t) for t, v in enumerate(c.per_token_rel_diff.tolist())]
    return out


SELECTION_SUFFIXES = ("ffn.router.topk_ids", "attn.indexer.topk")


def _host(t: Any) -> Any:
    """A probe on the host: selections are judged there (small integer tensors and their scores; the
    probes of either side may be left on the GPU, ``parity.probe_home``)."""
    return t.to("cpu") if isinstance(t, torch.Tensor) and t.device.type != "cpu" else t


def compare_probes(anchor: Mapping[str, torch.Tensor], test: Mapping[str, torch.Tensor], *, where: Where,
                   config: DSV4Config, ids: torch.Tensor, router_bias: RouterBias | None = None,
                   settings: CompareSettings = CompareSettings(),
                   only: Callable[[str], bool] | None = None,
                   device: str | torch.device | None = None) -> tuple[list[dict], PositionStats | None]:
    """Records for every probe the anchor emitted (in its emission order), and the logits position
    statistics (None when ``logits`` is not compared). ``only`` restricts the compared probe names.
    ``device``: where the run's models ran; on a GPU the float probes' metrics and the logits statistics
    are computed there (the probes come back on the host; the float64 softmax over a real vocabulary
    took seconds a prompt, the float metrics 7.4 s of a Pro-width harness run).

    Isolated mode also writes ``cosine_untied`` / ``rel_diff_untied`` for every token-row float probe:
    the metrics without the tokens whose indexer or router selection flipped *at a near tie* earlier
    in the same layer. There each test layer gets the anchor's input and every probe after a
    selection is a per-token function of it, so the exclusion is exact: what remains measures the
    layer's arithmetic, not which side of a tie two correct implementations fell on."""
    records: list[dict] = []
    stats: PositionStats | None = None
    isolated = where.compare_mode == "isolated"
    tie_rows: dict[int, np.ndarray] = {}   # layer -> tokens excluded from the untied metrics so far
    for name, a in anchor.items():
        if only is not None and not only(name):
            continue
        if name not in test:
            raise ProbeMismatchError(f"probe {name!r}: emitted by the anchor, missing on the test side "
                                     f"({where.pair}, {where.compare_mode}, prompt {where.prompt_id})")
        layer, suffix = parse_probe(name)
        b = test[name]
        if suffix in ENTRY_SUFFIXES or suffix in SELECTION_SUFFIXES:
            a, b = _host(a), _host(b)
        if suffix not in ENTRY_SUFFIXES and getattr(a, "shape", None) != getattr(b, "shape", None):
            # a judgement, not a crash: the probe fails the exact rule shape_mismatch == 0 (both shapes logged)
            log.warning("probe %s (%s, %s, prompt %s): shapes differ: anchor %s, test %s", name, where.pair,
                        where.compare_mode, where.prompt_id, tuple(a.shape), tuple(b.shape))
            records.append(where.rec(name, "shape_mismatch", 1.0))
            continue
        if suffix in ENTRY_SUFFIXES:
            records += [where.rec(name, m, v) for m, v in entry_agreement(a, b).items()]
            if a.shape != b.shape:
                continue   # the count mismatch is the finding; no element-wise comparison possible
        if isolated and layer is not None and layer not in tie_rows:
            tie_rows[layer] = np.zeros(int(ids.shape[0]), dtype=bool)
        if suffix == "ffn.router.topk_ids":
            assert layer is not None
            hash_layer = config.is_hash_layer(layer)
            bias = None if hash_layer or router_bias is None else router_bias(layer)
            a_logits = _host(anchor.get(layer_probe(layer, "ffn.router.logits")))
            if isolated and not hash_layer and a_logits is not None and a.shape == b.shape:
                tie_rows[layer] |= router_tie_flips(a, b, a_logits, bias, settings.router_tie).numpy()
            sel = router_agreement(
                a, b, a_logits=a_logits, a_weights=_host(anchor.get(layer_probe(layer, "ffn.router.weights"))),
                b_weights=_host(test.get(layer_probe(layer, "ffn.router.weights"))), bias=bias,
                hash_layer=hash_layer,
                tie_margin=settings.router_tie)
            records += [where.rec(name, m, v) for m, v in sel.items()]
            continue
        if suffix == "attn.indexer.topk":
            assert layer is not None
            a_scores = _host(anchor.get(layer_probe(layer, "attn.indexer.scores")))
            sel = indexer_agreement(a, b, a_scores=a_scores, tie_margin=settings.indexer_tie)
            if isolated and a_scores is not None and a.shape == b.shape:
                tie_rows[layer] |= indexer_tie_flips(a, b, a_scores, settings.indexer_tie).numpy()
            records += [where.rec(name, m, v) for m, v in sel.items()]
            continue
        untie = tie_rows.get(layer) if isolated and layer is not None and suffix not in ENTRY_SUFFIXES else None
        records += _float_records(where, name, a, b, settings, untie, device)
        if isolated and suffix == "out" and layer is not None:
            records.append(where.rec(name, "tie_flip_tokens", float(tie_rows[layer].sum())))
        if name == "logits":
            stats = position_stats(a, b, teacher_forced_targets(ids), topk=settings.topk,
                                   near_tie=settings.near_tie, device=device)
            last = stats.n - 1
            records += [where.rec(name, m, v, last) for m, v in at_position(stats, last).items()]
    return records, stats
