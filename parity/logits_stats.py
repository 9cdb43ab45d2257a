"""Logits statistics in the llama.cpp ``--kl-divergence`` style (docs/methods.md §2).

Direction: **KL(reference || test)** = sum_v p_ref(v) (ln p_ref(v) - ln p_test(v)), over the full
vocabulary, computed in float64 from the fp32 logits (never from quantized log-probs).

Per scored position: KL, top-1 agreement, the reference's top-2 log-prob margin (a *near tie* when
it is below ``near_tie`` nats: a top-1 flip there is not counted as a failure), top-k overlap, and
dp = p_test(t*) - p_ref(t*) for the position's target token t* (the actual next prompt token when
teacher-forced, the reference's argmax at the first generated position). Aggregates come with
standard errors: KL mean +- SE and percentiles up to 99.9 % and the maximum, top-1 agreement +-
binomial SE, dp percentiles, RMS dp +- SE, and the correlation-aware ln(PPL_test / PPL_ref) (the SE
of the mean of per-token ln p_ref - ln p_test, so correlated errors are not double counted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .constants import DEFAULT_TOPK, KL_DIRECTION  # noqa: E402,F401  (re-exported)
# A flip whose reference top-2 margin is below this many nats is a near tie (tie-aware agreement).
DEFAULT_NEAR_TIE = 0.1
KL_PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
DP_PERCENTILES = (0.1, 1.0, 5.0, 50.0, 95.0, 99.0, 99.9)


@dataclass(frozen=True)
class PositionStats:
    """Per-position values (float64 / bool / int64 tensors of length P)."""

    kl: torch.Tensor
    top1_agree: torch.Tensor
    near_tie: torch.Tensor
    topk_overlap: torch.Tensor
    dp: torch.Tensor
    ref_margin: torch.Tensor
    ref_top1: torch.Tensor
    test_top1: torch.Tensor
    # ln p_ref(t*) - ln p_test(t*) where t* is a real next token (NaN where it is the ref argmax).
    nll_diff: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.kl.numel())

    def select(self, index: torch.Tensor | slice) -> "PositionStats":
        return PositionStats(**{f: getattr(self, f)[index] for f in self.__dataclass_fields__})

    @staticmethod
    def concat(parts: list["PositionStats"]) -> "PositionStats":
        return PositionStats(**{f: torch.cat([getattr(p, f) for p in parts])
                                for f in PositionStats.__dataclass_fields__})


POSITION_CHUNK_ELEMENTS = 1 << 25   # float64 logits a chunk of positions holds (256 MiB per tensor)


def position_stats(ref_logits: torch.Tensor, test_logits: torch.Tensor, targets: torch.Tensor | None = None,
                   *, topk: int = DEFAULT_TOPK, near_tie: float = DEFAULT_NEAR_TIE,
                   device: str | torch.device | None = None) -> PositionStats:
    """``ref_logits``, ``test_logits``: [P, V]; ``targets``: [P] token ids, -1 (or None) = use the
    reference argmax (no real next token there). Computed in float64 on ``device`` when it is a GPU,
    else on the GPU either side is on, else on the host (at a real vocab the host's float64 softmax and
    top-k took seconds a prompt), in chunks of positions (every statistic is per position); the result
    is on the CPU."""
    if ref_logits.shape != test_logits.shape or ref_logits.dim() != 2:
        raise ValueError(f"logits: expected two [P, V] tensors of one shape, found {tuple(ref_logits.shape)} "
                         f"and {tuple(test_logits.shape)}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda":
        dev = next((t.device for t in (test_logits, ref_logits) if t.device.type == "cuda"), torch.device("cpu"))
    if targets is None:
        targets = torch.full((ref_logits.shape[0],), -1, dtype=torch.int64)
    targets = targets.to("cpu", torch.int64)
    step = max(1, POSITION_CHUNK_ELEMENTS // max(ref_logits.shape[1], 1))
    parts = [_position_stats(ref_logits[i:i + step], test_logits[i:i + step], targets[i:i + step], dev, topk, near_tie)
             for i in range(0, ref_logits.shape[0], step)]
    return parts[0] if len(parts) == 1 else PositionStats.concat(parts)


def _position_stats(ref_logits: torch.Tensor, test_logits: torch.Tensor, targets: torch.Tensor, dev: torch.device,
                    topk: int, near_tie: float) -> PositionStats:
    lr = torch.log_softmax(ref_logits.detach().to(dev, torch.float64), dim=-1)
    lt = torch.log_softmax(test_logits.detach().to(dev, torch.float64), dim=-1)
    pr = lr.exp()
    kl = (pr * (lr - lt)).sum(-1).clamp_min(0.0)   # tiny negative values are float64 rounding
    k = min(topk, lr.shape[-1])
    top_r = lr.topk(max(k, 2), dim=-1)
    top_t = lt.topk(k, dim=-1)
    ref_top1, test_top1 = top_r.indices[:, 0], top_t.indices[:, 0]
    margin = top_r.values[:, 0] - top_r.values[:, 1]
    ref_set = top_r.indices[:, :k]
    overlap = (ref_set.unsqueeze(-1) == top_t.indices.unsqueeze(-2)).any(-1).sum(-1).to(torch.float64) / k
    targets = targets.to(dev)
    real = targets >= 0
    t_star = torch.where(real, targets, ref_top1)
    lr_t = lr.gather(-1, t_star[:, None])[:, 0]
    lt_t = lt.gather(-1, t_star[:, None])[:, 0]
    nll = torch.where(real, lr_t - lt_t, torch.full_like(lr_t, math.nan))
    out = PositionStats(kl=kl, top1_agree=ref_top1 == test_top1, near_tie=margin < near_tie,
                        topk_overlap=overlap, dp=lt_t.exp() - lr_t.exp(), ref_margin=margin,
                        ref_top1=ref_top1, test_top1=test_top1, nll_diff=nll)
    return PositionStats(**{f: getattr(out, f).cpu() for f in PositionStats.__dataclass_fields__})


def teacher_forced_targets(ids: torch.Tensor) -> torch.Tensor:
    """Targets for prefill logits [T, V]: the next prompt token, and -1 at the last position."""
    ids = ids.to("cpu", torch.int64).reshape(-1)
    return torch.cat([ids[1:], torch.tensor([-1], dtype=torch.int64)])


def _se(x: torch.Tensor) -> float:
    n = x.numel()
    return float(x.std(unbiased=True) / math.sqrt(n)) if n > 1 else math.nan


def _pct(x: torch.Tensor, q: float) -> float:
    return float(torch.quantile(x, q / 100.0)) if x.numel() else math.nan


def _pname(q: float) -> str:
    return f"p{q:g}"


def summarize(s: PositionStats, prefix: str = "") -> dict[str, float]:
    """Aggregate metrics of a set of positions (metric names get ``prefix``)."""
    out: dict[str, float] = {"n_positions": float(s.n)}
    if s.n == 0:
        return {prefix + k: v for k, v in out.items()}
    agree = s.top1_agree.to(torch.float64)
    tie_aware = (s.top1_agree | s.near_tie).to(torch.float64)
    p = float(agree.mean())
    out.update({
        "kl_mean": float(s.kl.mean()), "kl_se": _se(s.kl), "kl_max": float(s.kl.max()),
        "top1_agree_rate": p, "top1_agree_se": math.sqrt(p * (1 - p) / s.n),
        "top1_agree_tieaware_rate": float(tie_aware.mean()),
        "near_tie_rate": float(s.near_tie.to(torch.float64).mean()),
        "topk_overlap_mean": float(s.topk_overlap.mean()),
        "dp_mean": float(s.dp.mean()), "dp_se": _se(s.dp),
        "dp_min": float(s.dp.min()), "dp_max": float(s.dp.max()),
    })
    out.update({f"kl_{_pname(q)}": _pct(s.kl, q) for q in KL_PERCENTILES})
    out.update({f"dp_{_pname(q)}": _pct(s.dp, q) for q in DP_PERCENTILES})
    sq = s.dp ** 2
    rms = math.sqrt(float(sq.mean()))
    out["dp_rms"] = rms
    # Delta method: se(sqrt(m)) = se(m) / (2 sqrt(m)).
    out["dp_rms_se"] = _se(sq) / (2 * rms) if rms > 0 and s.n > 1 else math.nan
    nll = s.nll_diff[~torch.isnan(s.nll_diff)]
    if nll.numel():
        out["ln_ppl_ratio_mean"] = float(nll.mean())
        out["ln_ppl_ratio_se"] = _se(nll)
    return {prefix + k: v for k, v in out.items()}


def at_position(s: PositionStats, i: int) -> dict[str, float]:
    """Metrics of one position (the first-token position of a prompt)."""
    return {"kl": float(s.kl[i]), "top1_agree": float(s.top1_agree[i]),
            "top1_agree_tieaware": float(s.top1_agree[i] | s.near_tie[i]), "near_tie": float(s.near_tie[i]),
            "topk_overlap": float(s.topk_overlap[i]), "dp": float(s.dp[i]), "ref_top2_margin": float(s.ref_margin[i])}


@dataclass(frozen=True)
class TopToken:
    rank: int
    token_id: int
    ref_logit: float
    ref_prob: float
    test_logit: float
    test_prob: float
    test_rank: int


def top_tokens(ref_logits: torch.Tensor, test_logits: torch.Tensor, k: int = DEFAULT_TOPK) -> list[TopToken]:
    """The reference's top-k tokens at one position [V], with both sides' logit, prob and the test rank."""
    r = ref_logits.detach().to("cpu", torch.float64)
    t = test_logits.detach().to("cpu", torch.float64)
    pr, pt = torch.softmax(r, -1), torch.softmax(t, -1)
    order_t = torch.argsort(t, descending=True)
    rank_t = torch.empty_like(order_t)
    rank_t[order_t] = torch.arange(order_t.numel())
    ids = torch.argsort(r, descending=True)[:k]
    return [TopToken(i + 1, int(v), float(r[v]), float(pr[v]), float(t[v]), float(pt[v]), int(rank_t[v]) + 1)
            for i, v in enumerate(ids)]


# Every metric name this module writes (rules are validated against it).
POSITION_METRICS = ("kl", "top1_agree", "top1_agree_tieaware", "near_tie", "topk_overlap", "dp", "ref_top2_margin")
AGGREGATE_METRICS = (
    "n_positions", "kl_mean", "kl_se", "kl_max", *(f"kl_{_pname(q)}" for q in KL_PERCENTILES),
    "top1_agree_rate", "top1_agree_se", "top1_agree_tieaware_rate", "near_tie_rate", "topk_overlap_mean",
    "dp_mean", "dp_se", "dp_min", "dp_max", *(f"dp_{_pname(q)}" for q in DP_PERCENTILES), "dp_rms", "dp_rms_se",
    "ln_ppl_ratio_mean", "ln_ppl_ratio_se",
)
FIRST_PREFIX = "first_"
LOGITS_METRICS = POSITION_METRICS + AGGREGATE_METRICS + tuple(FIRST_PREFIX + m for m in AGGREGATE_METRICS) + (
    "near_tie_threshold",)
