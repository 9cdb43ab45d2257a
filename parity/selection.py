"""Selection agreement for the router and the lightning indexer (docs/methods.md §6).

Selections are discrete: a tiny score error can flip an expert, after which a layer differs by a
whole expert. Each flip is classified by the **anchor's relative margin at the top-k cut**,
(s_k - s_{k+1}) / max(|s_k|, |s_{k+1}|) for its k-th and (k+1)-th largest scores: a flip where that
margin is below the tie margin is a near-tie flip, anything else a *clear* flip — the selection
analogue of near-tie-aware decoding. Relative, so one tie margin serves any score scale; exact ties
(the indexer's ReLU makes many scores exactly 0) have margin 0 and are always near ties, since the
two implementations may break them differently.

Router (``ffn.router.topk_ids`` / ``.weights`` / ``.logits``): per token Jaccard of the selected
expert sets, flipped-choice rate (tokens with any different expert), clear-flip rate, routed-weight
L1 over the union of experts (zeros for a missing one); on hash-routed layers the ids come from
``tid2eid[token]`` and must agree exactly. Selection scores are ``sqrt(softplus(logits)) + bias``
(spec §9; the bias is selection-only and read from the checkpoint when available).

Indexer (``attn.indexer.topk`` / ``.scores``): per query the overlap |A ∩ B| / |A| over *valid*
entries only (-1 slots excluded), flip and clear-flip rates, and rows whose valid counts differ.

Compressed entries (``attn.compressed_kv``, ``attn.indexer.k``): the entry counts must match.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Measured on the tiny model: logic-pair (BF16-noise) router flips had relative margins up to ~7e-3,
# indexer flips were mostly exact ties; NVFP4 flips reach margins of 0.3. 1e-2 separates the two.
DEFAULT_ROUTER_TIE = 1e-2
DEFAULT_INDEXER_TIE = 1e-2

ROUTER_METRICS = ("router_jaccard_mean", "router_jaccard_min", "router_flip_rate", "router_clear_flip_rate",
                  "router_flip_margin_min", "router_weight_l1_mean", "hash_route_exact", "hash_mismatch_rate")
INDEXER_METRICS = ("indexer_topk_overlap_mean", "indexer_topk_overlap_min", "indexer_flip_rate",
                   "indexer_clear_flip_rate", "indexer_valid_count_mismatch")
ENTRY_METRICS = ("entry_count_match", "entry_count_anchor", "entry_count_test")
SELECTION_METRICS = ROUTER_METRICS + INDEXER_METRICS + ENTRY_METRICS


class SelectionShapeError(ValueError):
    """Selection tensors of the two sides cannot be compared (different token counts or k)."""


def _check(name: str, a: torch.Tensor, b: torch.Tensor) -> None:
    if tuple(a.shape) != tuple(b.shape) or a.dim() != 2:
        raise SelectionShapeError(f"{name}: expected two [T, k] tensors of one shape, found "
                                  f"{tuple(a.shape)} and {tuple(b.shape)}")


def router_scores(logits: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Selection scores of spec §9: sqrt(softplus(l)) (+ the selection-only bias), float64."""
    s = torch.sqrt(F.softplus(logits.detach().to("cpu", torch.float64)))
    return s + bias.detach().to("cpu", torch.float64) if bias is not None else s


def cut_margin(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Per row: relative gap between the k-th and (k+1)-th largest finite scores (see the module
    doc); +inf where no finite (k+1)-th candidate exists (nothing could have been chosen instead)."""
    s = torch.where(torch.isfinite(scores), scores.to(torch.float64), torch.full_like(scores, -math.inf,
                                                                                      dtype=torch.float64))
    if s.shape[-1] <= k:
        return torch.full(s.shape[:-1], math.inf, dtype=torch.float64)
    top = s.topk(k + 1, dim=-1).values
    hi, lo = top[:, k - 1], top[:, k]
    valid = torch.isfinite(lo)
    lo_safe = torch.where(valid, lo, hi)
    scale = torch.maximum(hi.abs(), lo_safe.abs())
    rel = torch.where(scale > 0, (hi - lo_safe) / torch.where(scale > 0, scale, 1.0), torch.zeros_like(hi))
    return torch.where(valid, rel, torch.full_like(rel, math.inf))


def _set_overlap(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: |A ∩ B|, |A|, |B| over entries >= 0 (assumes no repeated valid id within a row)."""
    va, vb = a >= 0, b >= 0
    hit = ((a[:, :, None] == b[:, None, :]) & va[:, :, None] & vb[:, None, :]).any(-1)
    return hit.sum(-1), va.sum(-1), vb.sum(-1)


def _dense_weights(ids: torch.Tensor, w: torch.Tensor, n_experts: int) -> torch.Tensor:
    out = torch.zeros(ids.shape[0], n_experts, dtype=torch.float64)
    return out.scatter_add_(1, ids.to(torch.int64), w.detach().to("cpu", torch.float64))


def router_agreement(a_ids: torch.Tensor, b_ids: torch.Tensor, *, a_logits: torch.Tensor | None = None,
                     a_weights: torch.Tensor | None = None, b_weights: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, hash_layer: bool = False,
                     tie_margin: float = DEFAULT_ROUTER_TIE) -> dict[str, float]:
    _check("ffn.router.topk_ids", a_ids, b_ids)
    a, b = a_ids.detach().to("cpu", torch.int64), b_ids.detach().to("cpu", torch.int64)
    inter, na, nb = _set_overlap(a, b)
    union = na + nb - inter
    jac = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(inter, dtype=torch.float64))
    flipped = jac < 1
    out = {"router_jaccard_mean": float(jac.mean()), "router_jaccard_min": float(jac.min()),
           "router_flip_rate": float(flipped.double().mean())}
    if hash_layer:
        # tid2eid[token] fixes the ids *and their order*: nothing may differ.
        mismatch = (a != b).any(-1)
        out["hash_route_exact"] = float(not bool(mismatch.any()))
        out["hash_mismatch_rate"] = float(mismatch.double().mean())
    elif a_logits is not None:
        margin = cut_margin(router_scores(a_logits, bias), a.shape[1])
        clear = flipped & (margin >= tie_margin)
        out["router_clear_flip_rate"] = float(clear.double().mean())
        out["router_flip_margin_min"] = float(margin[flipped].min()) if bool(flipped.any()) else math.inf
    if a_weights is not None and b_weights is not None:
        _check("ffn.router.weights", a_weights, b_weights)
        n_exp = int(max(a.max(), b.max())) + 1 if a.numel() else 1
        if a_logits is not None:
            n_exp = max(n_exp, int(a_logits.shape[-1]))
        l1 = (_dense_weights(a, a_weights, n_exp) - _dense_weights(b, b_weights, n_exp)).abs().sum(-1)
        out["router_weight_l1_mean"] = float(l1.mean())
    return out


def indexer_agreement(a_topk: torch.Tensor, b_topk: torch.Tensor, *, a_scores: torch.Tensor | None = None,
                      tie_margin: float = DEFAULT_INDEXER_TIE) -> dict[str, float]:
    _check("attn.indexer.topk", a_topk, b_topk)
    a, b = a_topk.detach().to("cpu", torch.int64), b_topk.detach().to("cpu", torch.int64)
    inter, na, nb = _set_overlap(a, b)
    rows = na > 0    # rows with no valid anchor entry measure nothing (early queries)
    out = {"indexer_valid_count_mismatch": float((na != nb).sum())}
    if not bool(rows.any()):
        out.update(indexer_topk_overlap_mean=1.0, indexer_topk_overlap_min=1.0, indexer_flip_rate=0.0,
                   indexer_clear_flip_rate=0.0)
        return out
    ov = inter[rows].double() / na[rows].double()
    flipped = (inter < na) | (nb != na)
    out.update(indexer_topk_overlap_mean=float(ov.mean()), indexer_topk_overlap_min=float(ov.min()),
               indexer_flip_rate=float(flipped[rows].double().mean()))
    if a_scores is not None:
        margin = cut_margin(a_scores.detach().to("cpu", torch.float64), a.shape[1])
        clear = flipped & (margin >= tie_margin)
        out["indexer_clear_flip_rate"] = float(clear[rows].double().mean())
    return out


def router_tie_flips(a_ids: torch.Tensor, b_ids: torch.Tensor, a_logits: torch.Tensor, bias: torch.Tensor | None,
                     tie_margin: float = DEFAULT_ROUTER_TIE) -> torch.Tensor:
    """Tokens whose expert set differs at a near tie of the anchor's selection scores (bool [T])."""
    _check("ffn.router.topk_ids", a_ids, b_ids)
    a, b = a_ids.detach().to("cpu", torch.int64), b_ids.detach().to("cpu", torch.int64)
    inter, na, _ = _set_overlap(a, b)
    return (inter < na) & (cut_margin(router_scores(a_logits, bias), a.shape[1]) < tie_margin)


def indexer_tie_flips(a_topk: torch.Tensor, b_topk: torch.Tensor, a_scores: torch.Tensor,
                      tie_margin: float = DEFAULT_INDEXER_TIE) -> torch.Tensor:
    """Queries whose valid top-k set differs at a near tie of the anchor's scores (bool [T])."""
    _check("attn.indexer.topk", a_topk, b_topk)
    a, b = a_topk.detach().to("cpu", torch.int64), b_topk.detach().to("cpu", torch.int64)
    inter, na, nb = _set_overlap(a, b)
    return ((inter < na) | (nb != na)) & (cut_margin(a_scores.detach().to("cpu", torch.float64), a.shape[1])
                                          < tie_margin)


def entry_agreement(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Compressed entries formed on each side (dim 0 of ``compressed_kv`` / ``indexer.k``)."""
    na, nb = int(a.shape[0]), int(b.shape[0])
    return {"entry_count_match": float(na == nb), "entry_count_anchor": float(na), "entry_count_test": float(nb)}
