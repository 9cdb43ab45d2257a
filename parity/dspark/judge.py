"""Judging a draft-parity run: every check has its bound and the bound's origin beside it.

* **logic** (FP32 on both sides): analytic bounds of FP32 rounding, not learned from a run. The
  trunk's logic pair uses the same constants (parity/thresholds, header §3): 1e-10 on rel_diff (the
  squared relative L2, i.e. 1e-5 relative error, ~100 float32 roundings of unit ε = 6e-8 deep), 1e-9
  nats of KL; draft tokens and accepted counts identical unless a near tie (top-2 log-prob margin
  below ``near_tie``) explains the first difference.
* **floor**: statistical rules calibrated on the calibration prompt set (``python -m parity.dspark
  calibrate``, file ``parity/thresholds/dspark/<checkpoint>.toml``, each rule's origin in its note).
  Without that file for the checkpoint the floor's probe checks are *not judged* (said, never passed).
* **acceptance**: lossless speculation is exact (speculative tokens = plain greedy tokens of the same
  target, every pair); between pairs the mean acceptance lengths agree within 3 two-sample standard
  errors of the per-step τ of this run (logic: identical, as above).
* **bug_budget**: the exact kernel/weight audit of every target and draft call (its per-element
  analytic bounds, parity.audit); acceptance as logic.

A failure is a check with its place: column, mode, probe (stage + component), prompt."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .compare import probe_order
from .run import PAIRS, DraftParityResult

try:
    import tomllib
except ImportError:   # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

# metric -> (direction, logic bound, origin)
LOGIC_BOUNDS: dict[str, tuple[str, float, str]] = {
    "rel_diff": ("max", 1e-10, "FP32 both sides: 1e-5 relative L2 (squared 1e-10), the trunk logic pair's constant"),
    "cosine": ("min", 1 - 1e-10, "FP32 both sides: 1 - 1e-10, the trunk logic pair's constant"),
    "kl": ("max", 1e-9, "FP32 both sides: 1e-9 nats, the trunk logic pair's constant"),
    "top1_agree": ("min", 1.0, "FP32 both sides: identical argmax outside near ties (exact)"),
    "topk_overlap": ("min", 0.8, "FP32 both sides: at most one of the top 5 swapped at a tie"),
    "selection_agree": ("min", 1.0, "FP32 both sides: identical expert choice (exact)"),
    "abs_diff": ("max", 1e-4, "FP32 both sides: a (D+r)-term dot product, <= (D+r)·ε·max|term| ~ 2e-5, x5"),
}
EXACT = {"shape_mismatch": "shapes equal (exact)", "nonfinite": "no non-finite value where the anchor is finite (exact)"}
AGGREGATE = {"max": "max", "min": "min"}
RATE_METRICS = ("top1_agree", "topk_overlap", "selection_agree")
ACCEPT_SIGMAS = 3.0
ACCEPT_ORIGIN = "3 two-sample standard errors of the per-step τ of this run (statistical, not calibrated)"


@dataclass
class Check:
    column: str
    check: str
    where: str
    value: float | str
    bound: float | str
    origin: str
    passed: bool
    place: str = ""
    component: str = ""


@dataclass
class DraftVerdict:
    checks: list[Check] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    first_divergence: dict[str, dict[str, str]] = field(default_factory=dict)   # column -> mode -> where

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]


def rules_name(source: Any) -> str:
    """The name a checkpoint's draft rules are filed under: a built-in preset's name, else its config's."""
    from dsv4.config import PRESETS

    return source.spec if source.spec in PRESETS else source.config_name


def rules_path(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "thresholds" / "dspark" / f"{name}.toml"


def load_floor_rules(name: str, path: str | Path | None = None) -> tuple[dict[tuple[str, str, str, str], dict], str]:
    """``({(profile, mode, probe, metric): rule}, "plan/act_scale")`` of the calibrated floor rules;
    ({}, "") without a file."""
    p = Path(path) if path else rules_path(name)
    if not p.exists():
        if path:
            from ..errors import ParityInputError

            raise ParityInputError(f"--rules: expected a TOML file at {p}, found none")
        return {}, ""
    data = tomllib.loads(p.read_text(encoding="utf-8"))
    rules = {(r["profile"], r["mode"], r["probe"], r["metric"]): r for r in data.get("rule", [])}
    return rules, f"{data.get('plan', '')}/{data.get('act_scale', '')}"


def aggregate(rows: pd.DataFrame) -> pd.DataFrame:
    """One value per (column, mode, probe, metric): error metrics their max over prompts and rows,
    cosine its min, rates their mean (top-1 agreement without near-tie rows)."""
    if rows.empty:
        return rows
    ties = rows[rows.metric == "near_tie"].set_index(["column", "mode", "prompt", "probe", "row"])["value"]
    keep = rows[rows.metric != "near_tie"].copy()
    t1 = keep.metric == "top1_agree"
    if t1.any():
        idx = pd.MultiIndex.from_frame(keep.loc[t1, ["column", "mode", "prompt", "probe", "row"]])
        keep = keep.drop(keep.index[t1][ties.reindex(idx).fillna(0).to_numpy() > 0])
    out = []
    for (col, mode, probe, metric), g in keep.groupby(["column", "mode", "probe", "metric"], sort=False):
        how = "mean" if metric in RATE_METRICS else ("min" if metric == "cosine" else "max")
        i = g["value"].idxmin() if how == "min" else g["value"].idxmax()
        out.append({"column": col, "mode": mode, "probe": probe, "metric": metric, "how": how,
                    "value": float(g["value"].mean() if how == "mean" else g.loc[i, "value"]),
                    "prompt": "all" if how == "mean" else g.loc[i, "prompt"], "n": len(g),
                    "place": g["place"].iloc[0], "component": g["component"].iloc[0]})
    return pd.DataFrame(out)


def rate_bound(mean: float, n_cal: int, n: int) -> float:
    """Lower bound of a rate over ``n`` judged rows given its calibration ``mean`` over ``n_cal``:
    mean - 3 two-sample standard errors - 0.02, at least 0 (parity/dspark/calibrate.py says why)."""
    p = (mean * n_cal + 1) / (n_cal + 2)
    se = math.sqrt(p * (1 - p) * (1 / max(n_cal, 1) + 1 / max(n, 1)))
    return max(mean - 3 * se - 0.02, 0.0)


def _ok(direction: str, value: float, bound: float) -> bool:
    return (value <= bound) if direction == "max" else (value >= bound)


def _probe_checks(agg: pd.DataFrame, column: str, rules: dict, profile: str) -> tuple[list[Check], list[str]]:
    checks, unjudged = [], []
    for r in agg[agg.column == column].itertuples():
        where = f"{r.mode} {r.probe} ({r.how} over {r.n}, worst prompt {r.prompt})"
        if r.metric in EXACT:
            checks.append(Check(column, r.metric, where, r.value, 0.0, EXACT[r.metric], r.value == 0, r.place, r.component))
            continue
        if column == "logic":
            direction, bound, origin = LOGIC_BOUNDS[r.metric]
        else:
            rule = rules.get((profile, r.mode, r.probe, r.metric))
            if rule is None:
                continue
            direction, bound, origin = rule["direction"], float(rule["bound"]), rule["note"]
            if "mean" in rule:   # a rate: its bound is set for this sample's count
                bound = rate_bound(float(rule["mean"]), int(rule["n"]), int(r.n))
                origin = f"{origin} (judged over {r.n})"
        checks.append(Check(column, r.metric, where, r.value, bound, origin, _ok(direction, r.value, bound),
                            r.place, r.component))
    if column == "floor" and not rules:
        unjudged.append("floor probes: no calibrated rules for this checkpoint (python -m parity.dspark calibrate "
                        "writes them)")
    elif column == "floor" and not any(k[0] == profile for k in rules):
        unjudged.append(f"floor probes: no calibrated rules for reference profile {profile!r}")
    return checks, unjudged


def _tie_explains(a: Any, b: Any, near_tie: float) -> bool:
    """Two runs' accepted counts differ first at a step whose rejection sat at a near tie."""
    for i, (x, y) in enumerate(zip(a.accepted, b.accepted)):
        if x != y:
            return min(a.reject_margin[i], b.reject_margin[i]) < near_tie
    return True


def _tau_band(col: str, pair: str, base: dict[str, Any], runs: dict[str, Any]) -> Check:
    """A pair's mean τ against anchor+anchor's, within ACCEPT_SIGMAS two-sample standard errors."""
    a, b = _tau(base.values()), _tau(runs.values())
    (ma, va), (mb, vb) = _mean_se(a), _mean_se(b)
    bound = ACCEPT_SIGMAS * math.sqrt(va + vb)
    return Check(col, "acceptance_length", f"{pair} vs anchor+anchor (τ {mb:.3f} vs {ma:.3f})", abs(mb - ma), bound,
                 ACCEPT_ORIGIN, abs(mb - ma) <= bound + 1e-12, "speculative loop")


def _tau(runs: Iterable[Any]) -> list[int]:
    return [t for r in runs for t in r.tau]


def _mean_se(x: list[int]) -> tuple[float, float]:
    n = len(x)
    m = sum(x) / n
    var = sum((v - m) ** 2 for v in x) / (n - 1) if n > 1 else 0.0
    return m, var / n


def acceptance_checks(result: DraftParityResult) -> list[Check]:
    out: list[Check] = []
    near = result.spec.near_tie
    for col, run in result.columns.items():
        if not run.ran:
            continue
        for pair, runs in run.spec.items():
            tgt = pair.split("+")[0]
            for pid, s in runs.items():
                plain = run.greedy[tgt][pid]
                diff = next((i for i, (x, y) in enumerate(zip(s.tokens, plain.tokens)) if x != y), None)
                tie = diff is not None and min(s.margins[diff], plain.margins[diff]) < near
                value = "equal" if diff is None else (
                    f"differs at token {diff} (top-2 margins {plain.margins[diff]:.2g} plain, "
                    f"{s.margins[diff]:.2g} verify pass{': a near tie' if tie else ''})")
                out.append(Check(col, "lossless", f"{pair} {pid}", value, "equal",
                                 "speculative output = plain greedy output of the same target (exact; a first "
                                 "difference at a near tie is the target's batch variance, forgiven)",
                                 diff is None or tie, "speculative loop"))
        base = run.spec.get("anchor+anchor", {})
        for pair in PAIRS[1:]:
            runs = run.spec.get(pair, {})
            tau_check = _tau_band(col, pair, base, runs) if runs and base else None
            if col == "floor":
                out += [tau_check] if tau_check else []
                continue
            for pid, s in runs.items():
                same = s.accepted == base[pid].accepted
                tie = not same and _tie_explains(base[pid], s, near)
                # bug budget: every call is exact to its analytic bound (the audit), but a kernel's FP32
                # summation order may move a frozen-scale FP4 activation code, and the two models part by
                # more than a near tie (H100, cutedsl_sm90: accepted counts apart at margins >= 1e-3 with
                # 58k calls in bound): past near ties, the pair is judged by the τ band
                band = (col == "bug_budget" and not same and not tie and tau_check is not None
                        and tau_check.passed)
                value = "identical" if same else "near tie" if tie else \
                    f"differ, within the τ band ({tau_check.where.split('(')[-1]}" if band else "differ"
                origin = f"exact outside near ties (top-2 log-prob margin < {near:g})"
                if col == "bug_budget":
                    origin += f"; else the pair's τ within {ACCEPT_SIGMAS:g} two-sample SE (kernel summation order)"
                out.append(Check(col, "accepted_counts", f"{pair} vs anchor+anchor {pid}", value, "identical",
                                 origin, same or tie or band, "speculative loop"))
    return out


def audit_checks(result: DraftParityResult) -> list[Check]:
    run = result.columns.get("bug_budget")
    if run is None or not run.ran:
        return []
    a = run.audit
    out = [Check("bug_budget", "call_audit", f"{a.get('calls', 0)} calls (target and draft)", a.get("violations", 0),
                 0, "each output element within the NVFP4 GEMM's analytic bound (parity.audit)",
                 a.get("violations", 0) == 0 and not a.get("errors"), "kernel calls")]
    for who, wa in run.weight_audit.items():
        bad = len(wa.get("mismatching", []))
        out.append(Check("bug_budget", "weight_audit", f"{who}: {wa.get('modules', 0)} NVFP4 modules", bad, 0,
                         "what the kernel reads equals the stored NVFP4 weight (exact)", bad == 0, f"{who} weights"))
    return out


def first_divergence(checks: list[Check], agg: pd.DataFrame, n_layers: int, stages: int) -> dict[str, dict[str, str]]:
    order = {p: i for i, p in enumerate(probe_order(n_layers, stages))}
    out: dict[str, dict[str, str]] = {}
    for c in checks:
        if c.passed or c.check in ("lossless", "accepted_counts", "acceptance_length", "call_audit", "weight_audit"):
            continue
        mode, probe = c.where.split(" ")[:2]
        cur = out.setdefault(c.column, {}).get(mode)
        if cur is None or order.get(probe, 1e9) < order.get(cur.split(" ")[0], 1e9):
            out[c.column][mode] = f"{probe} ({c.place}, {c.component})"
    return out


def judge(result: DraftParityResult, rules_file: str | Path | None = None) -> DraftVerdict:
    from .run import rows_frame

    spec = result.spec
    c = spec.source.config
    agg = aggregate(rows_frame(result))
    rules, rules_plan = load_floor_rules(rules_name(spec.source), rules_file)
    v = DraftVerdict()
    if rules and rules_plan != f"{spec.plan.name}/{spec.act_scale}":
        v.unjudged.append(f"floor probes: the rules were calibrated for plan/act-scale {rules_plan!r}, this run "
                          f"uses {spec.plan.name}/{spec.act_scale} (calibrate for it)")
        rules = {}
    for col, run in result.columns.items():
        if not run.ran:
            v.unjudged.append(f"{col}: not run ({run.reason})")
            continue
        if col == "bug_budget" or agg.empty:
            continue
        checks, unj = _probe_checks(agg, col, rules, spec.profile)
        v.checks += checks
        v.unjudged += [u for u in unj if u not in " ".join(v.unjudged)]
    v.checks += acceptance_checks(result) + audit_checks(result)
    v.first_divergence = first_divergence(v.checks, agg, c.num_hidden_layers, c.dspark_stages)
    return v
