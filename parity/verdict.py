"""Judging a run: rules applied to records, the verdict, and the first divergence per pair.

First divergence (docs/methods.md §3): the first probe **in execution order** whose *isolated*
error exceeds its threshold — not the first point where the propagated curve looks bad, since a
layer can inherit error it did not cause. It names the probe's layer and component class.
The floor column is reported as a floor only when the logic column passes: with a layer bug, the
floor column measures the bug plus NVFP4, not what NVFP4 costs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from dsv4.probes import LAYER_PROBES, parse_probe

from .records import ALL_PROMPTS, AUDIT_MODE
from .rules import RuleOutcome, RuleSet, judge, outcomes, with_audit_rules

_SUFFIX_ORDER = {s: n for n, (s, _) in enumerate(LAYER_PROBES)}
_GLOBAL_ORDER = {"embed": (0, 0, 0), "hc_head": (2, 0, 0), "final_norm": (2, 1, 0), "logits": (2, 2, 0)}


def probe_order_key(name: str) -> tuple[int, int, int]:
    """Execution order: embed, then layer by layer (probe order within a layer), then the head."""
    layer, suffix = parse_probe(name)
    if layer is None:
        return _GLOBAL_ORDER[suffix]
    return (1, layer, _SUFFIX_ORDER[suffix])


@dataclass(frozen=True)
class Divergence:
    pair: str
    probe: str
    layer: int | None
    component: str
    metric: str
    value: float
    threshold: float
    op: str
    prompt_id: str

    def describe(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else "global"
        return (f"{self.probe} ({where}, component {self.component}): {self.metric} = {self.value:.6g}, "
                f"rule {self.op} {self.threshold:g} (prompt {self.prompt_id})")


def first_divergence(judged: pd.DataFrame, pair: str, mode: str = "isolated") -> Divergence | None:
    """``mode='propagated'`` only where no isolated run exists (engine dumps): then it names the
    first failing probe, which may inherit its error from an earlier one."""
    fail = judged[(~judged["passed"]) & (judged["pair"] == pair) & (judged["compare_mode"] == mode)
                  & (judged["prompt_id"] != ALL_PROMPTS)]
    if fail.empty:
        return None
    keyed = fail.assign(_order=[probe_order_key(p) for p in fail["probe"]])
    first_probe = min(keyed["_order"])
    rows = keyed[keyed["_order"] == first_probe]
    # Within the probe, the row farthest past its threshold (relative) names the metric shown.
    excess = [abs(v - t) / max(abs(t), 1e-12) for v, t in zip(rows["value"], rows["threshold"])]
    row = rows.iloc[max(range(len(excess)), key=excess.__getitem__)]
    layer = None if pd.isna(row["layer"]) else int(row["layer"])
    return Divergence(pair, row["probe"], layer, row["component"], row["metric"], float(row["value"]),
                      float(row["threshold"]), row["op"], row["prompt_id"])


NONFINITE_METRIC = "nonfinite_mismatch"


def first_nonfinite(df: pd.DataFrame, pair: str) -> dict[str, Divergence]:
    """Where non-finite values (NaN/Inf where the anchor is finite, or the reverse) first appear, per
    compare mode, in execution order. ``isolated``: the component that produced them from the
    anchor's finite input (the source); ``propagated``: where they first show in the end-to-end run."""
    rows = df[(df["pair"] == pair) & (df["metric"] == NONFINITE_METRIC) & (df["value"] > 0)
              & (df["prompt_id"] != ALL_PROMPTS)]
    out: dict[str, Divergence] = {}
    for mode, g in rows.groupby("compare_mode"):
        row = g.iloc[min(range(len(g)), key=lambda i: probe_order_key(g["probe"].iloc[i]))]
        layer = None if pd.isna(row["layer"]) else int(row["layer"])
        out[str(mode)] = Divergence(pair, row["probe"], layer, row["component"], NONFINITE_METRIC,
                                    float(row["value"]), 0.0, "<=", row["prompt_id"])
    return out


@dataclass
class Verdict:
    judged: pd.DataFrame
    outcomes: list[RuleOutcome]
    pairs: list[str]
    first_divergence: dict[str, Divergence | None]
    extra_failures: list[str]
    # pair -> {compare mode: first non-finite probe}: its own finding, named before any divergence
    nonfinite: dict[str, dict[str, Divergence]] = None  # type: ignore[assignment]

    def nonfinite_source(self, pair: str) -> str | None:
        found = (self.nonfinite or {}).get(pair) or {}
        if not found:
            return None
        iso, prop = found.get("isolated"), found.get("propagated")
        src = iso or prop
        where = f"layer {src.layer}" if src.layer is not None else "global"
        text = (f"non-finite values produced at {src.probe} ({where}, component {src.component}; "
                f"{int(src.value)} entries, prompt {src.prompt_id})")
        if iso is not None:
            text += ", from finite inputs (isolated)"
        if prop is not None and (iso is None or prop.probe != iso.probe):
            text += f"; first seen end to end at {prop.probe}"
        return text

    @property
    def failed_rules(self) -> list[RuleOutcome]:
        return [o for o in self.outcomes if not o.passed]

    def pair_passed(self, pair: str) -> bool:
        j = self.judged
        return bool(j.empty or j[j["pair"] == pair]["passed"].all())

    @property
    def floor_is_floor(self) -> bool:
        """The floor column means 'what NVFP4 costs' only if the logic column ran and passed."""
        return "logic" in self.pairs and self.pair_passed("logic")

    @property
    def passed(self) -> bool:
        return not self.failed_rules and not self.extra_failures

    def summary(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "floor_is_floor": self.floor_is_floor,
            "pairs": {p: {"passed": self.pair_passed(p),
                          "first_divergence": (d.__dict__ if (d := self.first_divergence.get(p)) else None)}
                      for p in self.pairs},
            "failed_rules": [{"rule": o.rule.describe(), "matched": o.matched, "failed": o.failed,
                              "worst": o.worst, "would_pass_at": o.would_pass_at,
                              "worst_probe": (o.worst_record or {}).get("probe"),
                              "worst_prompt": (o.worst_record or {}).get("prompt_id")}
                             for o in self.failed_rules],
            "extra_failures": list(self.extra_failures),
            "nonfinite": {p: self.nonfinite_source(p) for p in self.pairs if self.nonfinite_source(p)},
        }


def evaluate(df: pd.DataFrame, rules: RuleSet, extra_failures: list[str] | None = None,
             divergence_mode: str = "isolated") -> Verdict:
    audited = bool(((df["pair"] == "bug_budget") & (df["compare_mode"] == AUDIT_MODE)).any()) if not df.empty else False
    rules = with_audit_rules(rules, audited)
    judged = judge(df, rules)
    pairs = [p for p in ("logic", "floor", "bug_budget") if p in set(df["pair"])]
    # The audit's first divergence is its first violating call in execution order (records per component probe).
    modes = {p: (AUDIT_MODE if p == "bug_budget" and audited else divergence_mode) for p in pairs}
    return Verdict(judged, outcomes(judged, rules), pairs,
                   {p: first_divergence(judged, p, modes[p]) for p in pairs}, list(extra_failures or []),
                   {p: first_nonfinite(df, p) for p in pairs})
