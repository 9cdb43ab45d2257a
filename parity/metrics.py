"""Per-tensor comparison metrics (docs/methods.md §4), whole-tensor and per token (per row).

Convention: ``a`` is the anchor (the higher-precision side, e.g. the reference), ``b`` the side under
test. Everything is computed in float64 on the CPU, so a metric near its ideal value (cosine 1 - 1e-7)
is not lost in float32 rounding of the reductions.

* ``cosine``   = <a,b> / (|a| |b|); 1 for two zero tensors, 0 when exactly one is zero.
* ``rel_diff`` = 1 - 2<a,b> / (|a|^2 + |b|^2) (SGLang / DeepGEMM), computed as the equal
  |a - b|^2 / (|a|^2 + |b|^2) to avoid cancellation. >= 1 - cosine, with equality only for equal
  norms, so a scale error (a wrong global scale) shows here and not in the cosine.
* ``rel_l2``   = |a - b| / |a|.
* ``max_abs``  = max |a - b|.
* ``snr_db``   = 10 log10(|a|^2 / |a - b|^2); +inf for identical tensors.

Non-finite entries (the indexer's causally masked ``-inf`` scores) are compared by pattern: the
metrics use only entries finite on both sides and ``nonfinite_mismatch`` counts entries whose
non-finite pattern differs (finite on one side only, or a different non-finite value).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

FLOAT_METRICS = ("cosine", "rel_diff", "rel_l2", "max_abs", "snr_db")
# Summaries of the per-token curves that are stored as records (the full curves stay in memory):
# the worst token (position-dependent bugs) and the median token (robust: one token whose expert
# choice flipped at a near tie moves the whole-tensor metric but not the median).
TOKEN_METRICS = ("cosine_tok_min", "rel_diff_tok_max", "rel_diff_tok_p50")
# Isolated mode only: the metrics without tokens whose selection flipped at a near tie (compare.py).
UNTIED_METRICS = ("cosine_untied", "rel_diff_untied", "tie_flip_tokens")
# shape_mismatch: written by parity.compare (1.0) when the two sides' probe shapes differ (a judgement)
ALL_TENSOR_METRICS = FLOAT_METRICS + TOKEN_METRICS + UNTIED_METRICS + ("nonfinite_mismatch", "shape_mismatch")


class ShapeMismatchError(ValueError):
    """The two tensors of a comparison differ in shape."""


def _as_pair(a: torch.Tensor, b: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, int]:
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeMismatchError(f"shapes differ: anchor {tuple(a.shape)}, test {tuple(b.shape)}")
    a64 = a.detach().to(device, torch.float64)
    b64 = b.detach().to(device, torch.float64)
    fa, fb = torch.isfinite(a64), torch.isfinite(b64)
    both = fa & fb
    if bool(both.all()):
        return a64, b64, 0
    # Non-finite on both sides with the same value (-inf == -inf) is agreement; NaN never is.
    same_nonfinite = ~fa & ~fb & (a64 == b64)
    mismatch = int((~both & ~same_nonfinite).sum())
    zero = torch.zeros((), dtype=torch.float64)
    return torch.where(both, a64, zero), torch.where(both, b64, zero), mismatch


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[rows, rest]: dim 0 is the token (or compressed-entry) axis of every probe."""
    return x.reshape(x.shape[0], -1) if x.dim() > 1 else x.reshape(-1, 1)


def _cosine(dot: torch.Tensor, na2: torch.Tensor, nb2: torch.Tensor) -> torch.Tensor:
    denom = torch.sqrt(na2 * nb2)
    both_zero = (na2 == 0) & (nb2 == 0)
    cos = torch.where(denom > 0, dot / torch.where(denom > 0, denom, 1.0), torch.zeros_like(dot))
    return torch.where(both_zero, torch.ones_like(cos), cos).clamp(-1.0, 1.0)


def _rel_diff(dot: torch.Tensor, na2: torch.Tensor, nb2: torch.Tensor) -> torch.Tensor:
    s = na2 + nb2
    return torch.where(s > 0, 1.0 - 2.0 * dot / torch.where(s > 0, s, 1.0), torch.zeros_like(dot))


def _rel_diff_stable(dd: torch.Tensor, na2: torch.Tensor, nb2: torch.Tensor) -> torch.Tensor:
    s = na2 + nb2
    return torch.where(s > 0, dd / torch.where(s > 0, s, 1.0), torch.zeros_like(dd))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y, _ = _as_pair(a, b)
    return float(_cosine((x * y).sum(), (x * x).sum(), (y * y).sum()))


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y, _ = _as_pair(a, b)
    return float(_rel_diff_stable(((x - y) ** 2).sum(), (x * x).sum(), (y * y).sum()))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y, _ = _as_pair(a, b)
    return _safe_ratio(float((x - y).norm()), float(x.norm()))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y, _ = _as_pair(a, b)
    return float((x - y).abs().max()) if x.numel() else 0.0


def snr_db(a: torch.Tensor, b: torch.Tensor) -> float:
    x, y, _ = _as_pair(a, b)
    return _snr(float((x * x).sum()), float(((x - y) ** 2).sum()))


def _safe_ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _snr(signal: float, noise: float) -> float:
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def per_token_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y, _ = _as_pair(a, b)
    x, y = _rows(x), _rows(y)
    return _cosine((x * y).sum(1), (x * x).sum(1), (y * y).sum(1))


def per_token_rel_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y, _ = _as_pair(a, b)
    x, y = _rows(x), _rows(y)
    return _rel_diff_stable(((x - y) ** 2).sum(1), (x * x).sum(1), (y * y).sum(1))


def per_token_rel_l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y, _ = _as_pair(a, b)
    x, y = _rows(x), _rows(y)
    num, den = (x - y).norm(dim=1), x.norm(dim=1)
    out = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), torch.zeros_like(num))
    return torch.where((den == 0) & (num > 0), torch.full_like(num, math.inf), out)


def per_token_max_abs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y, _ = _as_pair(a, b)
    return (_rows(x) - _rows(y)).abs().amax(dim=1)


def per_token_snr_db(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    x, y, _ = _as_pair(a, b)
    x, y = _rows(x), _rows(y)
    sig, noise = (x * x).sum(1), ((x - y) ** 2).sum(1)
    return torch.tensor([_snr(float(s), float(n)) for s, n in zip(sig, noise)], dtype=torch.float64)


@dataclass(frozen=True)
class TensorComparison:
    """Every metric of one (anchor, test) tensor pair. ``per_token_*`` are float64 [rows] curves."""

    cosine: float
    rel_diff: float
    rel_l2: float
    max_abs: float
    snr_db: float
    nonfinite_mismatch: int
    per_token_cosine: torch.Tensor
    per_token_rel_diff: torch.Tensor
    row_sums: np.ndarray | None = None   # float64 [4, rows]: <x,y>, |x|^2, |y|^2, |x-y|^2 per row

    def without_rows(self, drop: np.ndarray) -> tuple[float, float]:
        """(cosine, rel_diff) over the rows not in ``drop`` (a bool mask), from the stored row sums."""
        if self.row_sums is None:
            raise ValueError("without_rows: this comparison kept no row sums")
        dot, na2, nb2, dd = (float(v) for v in self.row_sums[:, ~drop].sum(1))
        return _scalar_cosine(dot, na2, nb2), (dd / (na2 + nb2) if na2 + nb2 > 0 else 0.0)

    @property
    def rows(self) -> int:
        return int(self.per_token_cosine.numel())

    def worst_token(self) -> int | None:
        """Row with the largest rel_diff (None for an empty tensor)."""
        return int(self.per_token_rel_diff.numpy().argmax()) if self.rows else None

    def lowest_cosine_token(self) -> int | None:
        """Row with the smallest cosine (None for an empty tensor)."""
        return int(self.per_token_cosine.numpy().argmin()) if self.rows else None

    def scalars(self) -> dict[str, float]:
        out = {m: float(getattr(self, m)) for m in FLOAT_METRICS}
        out["nonfinite_mismatch"] = float(self.nonfinite_mismatch)
        if self.rows:
            # numpy on the float64 curves: these are tiny, per-op overhead dominates (README timing)
            cos, rd = self.per_token_cosine.numpy(), self.per_token_rel_diff.numpy()
            out["cosine_tok_min"] = float(cos.min())
            out["rel_diff_tok_max"] = float(rd.max())
            # lower median, as torch.median: an actual token's value, not an average of two
            out["rel_diff_tok_p50"] = float(np.partition(rd, (len(rd) - 1) // 2)[(len(rd) - 1) // 2])
        return out


def _scalar_cosine(dot: float, na2: float, nb2: float) -> float:
    if na2 == 0 and nb2 == 0:
        return 1.0
    denom = math.sqrt(na2 * nb2)
    return max(-1.0, min(1.0, dot / denom)) if denom > 0 else 0.0


def _scalar_rel_diff(dot: float, na2: float, nb2: float) -> float:
    s = na2 + nb2
    return 1.0 - 2.0 * dot / s if s > 0 else 0.0


def _token_curves(sums: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cosine and rel_diff from the float64 row sums [xy, xx, yy, dd] (numpy: these are tiny
    arrays, where per-op overhead, not arithmetic, is the cost)."""
    dot, na2, nb2, dd = sums
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = dot / np.sqrt(na2 * nb2)
        rd = dd / (na2 + nb2)
    if not (np.isfinite(cos).all() and np.isfinite(rd).all()):   # rows with a zero norm
        cos = np.where((na2 == 0) & (nb2 == 0), 1.0, np.where((na2 == 0) | (nb2 == 0), 0.0, cos))
        rd = np.where(na2 + nb2 == 0, 0.0, rd)
    return torch.from_numpy(np.clip(cos, -1.0, 1.0)), torch.from_numpy(rd)


def _row_sums(x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Row sums of x*y, x*x, y*y, d*d (d = x - y). The products go through one scratch tensor: the
    same values summed the same way as four fresh temporaries (bit for bit, tested), without
    allocating and faulting in three more tensors of the probe's size (0.56 -> 0.30 s for a 117 MB
    Pro-width probe in float64 on a 2-core CPU)."""
    d = x - y
    buf = torch.empty_like(x)
    sums = []
    for u, v in ((x, y), (x, x), (y, y), (d, d)):
        torch.mul(u, v, out=buf)
        sums.append(buf.sum(1))
    return torch.stack(sums).to(torch.float64).cpu().numpy(), d


def metric_device(device: torch.device | str | None) -> torch.device:
    """Where :func:`compare_tensors` computes: the run's CUDA device, else the CPU. On a GPU the probes
    (kept on the host) go up one pair at a time: at Pro width the CPU's comparisons were 7.4 s of a
    48 s harness run on an H100 (issue: harness overhead)."""
    d = torch.device(device) if device is not None else torch.device("cpu")
    return d if d.type == "cuda" and torch.cuda.is_available() else torch.device("cpu")


BYTES_PER_ELEMENT = {torch.float32: 4 * 4 + 2 * 8 + 3, torch.float64: 4 * 8 + 2 * 8 + 3}


def rows_that_fit(rows: int, cols: int, work: torch.dtype, dev: torch.device) -> int:
    """How many rows of one comparison fit in half the GPU's free memory at once (0: not one): x, y,
    their difference and a product buffer in ``work``, and the float64 pair with masks of the
    non-finite path. A long prompt's real-vocabulary logits (8k tokens x 129,280 in FP32: 37 GB of
    temporaries) are compared in row blocks; before, they went to the host whole, and at 8,192 tokens
    the comparisons took 44 s of a 76 s Flash harness on an H100 (``real_width_flash_8k_h100_s6.json``)."""
    per_row = max(cols, 1) * BYTES_PER_ELEMENT[work]
    return min(rows, int(0.5 * torch.cuda.mem_get_info(dev)[0]) // per_row)


def _on(t: torch.Tensor, dev: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``t`` on ``dev`` as ``dtype``; to a GPU it travels in its own (narrower) dtype and is widened there."""
    t = t.detach()
    if dev.type == "cpu" or t.device == dev:
        return t.to(dev, dtype)
    return t.to(dev, non_blocking=t.is_pinned()).to(dtype)


def block_plan(rows: int, cols: int, work: torch.dtype, dev: torch.device) -> tuple[torch.device, int]:
    """(where, rows per block): all rows at once on the CPU; on a GPU as many as fit, or the CPU when
    not one row does."""
    if dev.type != "cuda":
        return dev, max(rows, 1)
    fit = rows_that_fit(rows, cols, work, dev)
    return (dev, max(fit, 1)) if fit >= 1 else (torch.device("cpu"), max(rows, 1))


def _block_sums(xa: torch.Tensor, xb: torch.Tensor, dev: torch.device,
                work: torch.dtype) -> tuple[np.ndarray, int, float]:
    """One block of rows: (float64 row sums [4, rows], non-finite mismatches, max |x - y|)."""
    x, y = _on(xa, dev, work), _on(xb, dev, work)
    sums, d = _row_sums(x, y)
    mismatch = 0
    if not np.isfinite(sums).all():
        xm, ym, mismatch = _as_pair(x, y, dev)
        sums, d = _row_sums(xm, ym)
    lo, hi = torch.aminmax(d) if d.numel() else (torch.zeros(()), torch.zeros(()))
    return sums, mismatch, max(abs(float(lo)), abs(float(hi)))


def compare_tensors(a: torch.Tensor, b: torch.Tensor, device: torch.device | str | None = None) -> TensorComparison:
    """All metrics at once: four row reductions, every scalar and curve from them.

    Arithmetic is float32 with float64 for everything after the row sums: products of BF16 values
    are exact in float32, torch's float32 sums are pairwise (relative error ~1e-7), and rel_diff is
    computed as sum (x - y)^2 / (sum x^2 + sum y^2) — equal to 1 - 2<x,y>/(|x|^2 + |y|^2) without its
    cancellation near 0, so it stays exact to ~1e-7 *relative*. This halves the harness's metric time
    against float64 (the ≤ 25 % overhead target). The fast path skips element-wise finiteness masks:
    a non-finite entry makes the sums non-finite, and only then are masks built (indexer ``-inf``)."""
    if tuple(a.shape) != tuple(b.shape):
        raise ShapeMismatchError(f"shapes differ: anchor {tuple(a.shape)}, test {tuple(b.shape)}")
    # FP32 probes (the logic column computes in FP32 on both sides, ~1e-13 apart) get float64 sums: a
    # float32 dot product would put cosine's own noise (~1e-7) above the differences it must resolve.
    work = torch.float64 if torch.float32 in (a.dtype, b.dtype) else torch.float32
    xa, xb = _rows(a.detach()), _rows(b.detach())
    n = int(xa.shape[0])
    dev, step = block_plan(n, int(xa.shape[1]), work, metric_device(device))
    # one block whenever it fits (the same arithmetic as one pass); row blocks otherwise: every
    # metric is a sum of per-row sums, so blocks change nothing but their memory
    parts = [_block_sums(xa[i:i + step], xb[i:i + step], dev, work) for i in range(0, max(n, 1), step)]
    sums = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts], axis=1)
    mismatch = sum(p[1] for p in parts)
    max_abs = max(p[2] for p in parts)
    dot, na2, nb2, dd = (float(v) for v in sums.sum(1))
    tok_cos, tok_rd = _token_curves(sums)
    return TensorComparison(
        cosine=_scalar_cosine(dot, na2, nb2),
        rel_diff=dd / (na2 + nb2) if na2 + nb2 > 0 else 0.0,
        rel_l2=_safe_ratio(math.sqrt(dd), math.sqrt(na2)),
        max_abs=max_abs,
        snr_db=_snr(na2, dd),
        nonfinite_mismatch=mismatch,
        per_token_cosine=tok_cos,
        per_token_rel_diff=tok_rd,
        row_sums=sums,
    )
