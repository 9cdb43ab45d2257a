"""``python -m parity.dspark calibrate``: the floor column's draft rules for one checkpoint, from the
calibration prompt set (held out from the standard set the verdict runs on), both prompt modes and
both reference profiles, both compare modes. Written to ``parity/thresholds/dspark/<checkpoint>.toml``.

Per (profile, compare mode, probe, metric), over prompts and block rows:
* error metrics: bound = worst × 2 (the trunk rules' margin) for whole tensors (rel_diff); × 4 for
  the per-row ones (KL, confidence |Δ|), extreme values over every block row (the trunk rules'
  extra × 2 for maxima over tokens);
* cosine: bound = 1 − 2·(1 − worst);
* rates (top-1 agreement without near ties, top-5 overlap, expert selection): the calibration mean
  and count are written; the judge sets the bound for the judged sample's own count n (``rate_bound``):
  mean − 3 two-sample standard errors − 0.02 (one flip in fifty), at least 0. The variance is the
  binomial p̃(1 − p̃) with p̃ = (mean·N + 1)/(N + 2) (never 0 after N rows without a miss; for the
  top-5 overlap, a fraction per row, an upper bound of its variance).
Each rule's note says its worst value, where it was seen and the margin.

The clean noise depends on the CPU's float kernels (which near ties flip in the stage routers): the
stage-0 router weights of tiny-trained-dspark (official, propagated) had worst 8.2e-5 on one machine
type and 0.050 on an AVX-512-FP16/AMX Xeon (one calibration row's expert choice flipped there,
2026-12-05). A shipped file is the ``envelope`` of calibrations on each machine type (``calibrate
--envelope FILE``); each rule keeps every machine's bound in ``calibrated``."""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from .judge import RATE_METRICS, aggregate, rate_bound
from .run import DraftSpec, rows_frame, run_draft_parity

PROFILES = ("bf16", "official")
MARGIN = 2.0
ROW_MARGIN = 4.0             # maxima over block rows (extreme-value statistics)
ROW_METRICS = ("kl", "abs_diff")


def rules_from(agg: Any, profile: str, n_prompts: int) -> list[dict[str, Any]]:
    out = []
    for r in agg.itertuples():
        if r.metric in ("shape_mismatch", "nonfinite"):
            continue
        extra: dict[str, Any] = {}
        if r.metric in RATE_METRICS:
            bound, direction = rate_bound(r.value, r.n, r.n), "min"
            note = f"mean {r.value:.4g} over {r.n} rows of {n_prompts} calibration prompts - 3 SE(two-sample) - 0.02"
            extra = {"mean": float(r.value), "n": int(r.n)}
        elif r.metric == "cosine":
            bound, direction = 1 - MARGIN * (1 - r.value), "min"
            note = f"worst {r.value:.6g} (prompt {r.prompt}) over {n_prompts} calibration prompts, 1 - {MARGIN:g}(1 - worst)"
        else:
            m = ROW_MARGIN if r.metric in ROW_METRICS else MARGIN
            bound, direction = r.value * m, "max"
            note = f"worst {r.value:.4g} (prompt {r.prompt}) over {n_prompts} calibration prompts x {m:g}"
        out.append({"profile": profile, "mode": r.mode, "probe": r.probe, "metric": r.metric, "direction": direction,
                    "bound": float(bound), "note": note, **extra})
    return out


def allowed_error(rule: dict[str, Any]) -> float:
    """The error a bound allows: the bound itself for maxima, 1 - bound for minima (cosine, rates)."""
    return rule["bound"] if rule["direction"] == "max" else 1.0 - rule["bound"]


def envelope(fresh: Sequence[dict[str, Any]], previous: dict[tuple, dict[str, Any]], label: str) -> list[dict[str, Any]]:
    """Rule by rule, the looser of a fresh calibration and a previous file's (a rate rule keeps the
    mean and count of the side it takes), with both machines' bounds in ``calibrated``; a rule on one
    side only is kept as it is."""
    out, left = [], dict(previous)
    for new in fresh:
        key = (new["profile"], new["mode"], new["probe"], new["metric"])
        old = left.pop(key, None)
        if old is None:
            out.append(dict(new))
            continue
        seen = list(old.get("calibrated", [old["bound"]])) + [new["bound"]]
        took_old = allowed_error(old) >= allowed_error(new)
        keep = dict(old if took_old else new)
        keep["note"] = keep["note"].split(" | ")[0]
        if allowed_error(old) != allowed_error(new):
            who, other = (label, new) if took_old else ("the previous file", old)
            keep["note"] += f" | envelope: {who} needs only {other['bound']:.6g}"
        keep["calibrated"] = seen
        out.append(keep)
    return out + list(left.values())


def to_toml(rules: list[dict[str, Any]], header: str, plan: str, act_scale: str) -> str:
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    lines += ["", f"plan = {_val(plan)}", f"act_scale = {_val(act_scale)}", ""]
    for r in rules:
        keys = ("profile", "mode", "probe", "metric", "direction", "bound", "mean", "n", "calibrated", "note")
        lines += ["[[rule]]"] + [f"{k} = {_val(r[k])}" for k in keys if k in r] + [""]
    return "\n".join(lines)


def _val(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, (float, int)) and not isinstance(v, bool):
        return repr(v)
    return "'" + str(v).replace("'", "’") + "'"


def calibrate(source: Any, prompts: Sequence[Any], plan: Any, device: str,
              progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for profile in PROFILES:
        spec = DraftSpec(source=source, prompts=prompts, plan=plan, profile=profile, device=device,
                         columns=("floor",), n_tokens=0)   # act_scale: DraftSpec's default (frozen)
        result = run_draft_parity(spec, lambda m, p=profile: progress(f"{p}: {m}"))
        rules += rules_from(aggregate(rows_frame(result)), profile, len(prompts))
    return rules
