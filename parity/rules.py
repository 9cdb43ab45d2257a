"""Threshold rules (docs/methods.md §8): regex over probe names, a metric, an operator, a value.

A thresholds file is TOML::

    [settings]                      # measurement settings the rules were calibrated with
    near_tie_logprob = 0.1

    [[rule]]
    probe = '^layers\\.\\d+\\.attn\\.q$'   # re.fullmatch over the probe name
    metric = "cosine"
    op = ">="
    value = 0.99
    pair = "floor"                  # optional: logic | floor | bug_budget
    compare_mode = "isolated"       # optional: propagated | isolated
    profile = "bf16"                # optional: the reference profile anchoring the pair
    prompt = '\\*'                  # optional: re.fullmatch over prompt_id ('*' = run aggregates)

Rules are validated before anything is judged: a regex matching no normative probe name, an unknown
metric, operator, pair or mode is a :class:`RulesError` (bad input, exit 2). Judging never mutates
records: every (record, matching rule) pair gets a verdict; a record matched by no rule is unjudged.
"""
from __future__ import annotations

import math
import operator
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from dsv4.probes import probe_names

from .errors import RulesError
from .logits_stats import DEFAULT_NEAR_TIE, LOGITS_METRICS
from .metrics import ALL_TENSOR_METRICS
from .records import AUDIT_MODE, PAIRS, RECORD_MODES
from .selection import DEFAULT_INDEXER_TIE, DEFAULT_ROUTER_TIE, SELECTION_METRICS

# The kernel audit's metrics (parity.audit): violations must be 0 (exact); calls and the worst
# |got - expected| / bound ratio are information.
AUDIT_METRICS = ("audit_violations", "weight_mismatches", "audit_calls", "audit_worst_ratio")
KNOWN_METRICS = frozenset(ALL_TENSOR_METRICS + SELECTION_METRICS + LOGITS_METRICS + AUDIT_METRICS)
PROFILES = ("bf16", "official")
OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
_RULE_KEYS = {"probe", "metric", "op", "value", "pair", "compare_mode", "profile", "prompt", "note"}
_TOP_KEYS = {"rule", "settings", "calibration"}
DEFAULT_SETTINGS: Mapping[str, float] = {"near_tie_logprob": DEFAULT_NEAR_TIE, "router_tie_margin": DEFAULT_ROUTER_TIE,
                                         "indexer_tie_margin": DEFAULT_INDEXER_TIE}
# Probe names every rule is checked against: 64 CSA layers cover every layer suffix and index a real
# model can have (61 layers for Pro).
_NORMATIVE = tuple(probe_names(64))


from .constants import default_rules_path  # noqa: E402,F401  (re-exported)


@dataclass(frozen=True)
class Rule:
    probe: str
    metric: str
    op: str
    value: float
    pair: str | None = None
    compare_mode: str | None = None
    profile: str | None = None
    prompt: str | None = None
    note: str = ""
    index: int = 0

    def describe(self) -> str:
        where = "".join(f" {k}={v}" for k, v in (("pair", self.pair), ("mode", self.compare_mode),
                                                 ("profile", self.profile), ("prompt", self.prompt)) if v)
        return f"#{self.index} {self.probe} {self.metric} {self.op} {self.value:g}{where}"

    def passes(self, value: float) -> bool:
        # NaN never passes: a value that could not be measured cannot confirm anything.
        return not math.isnan(value) and OPS[self.op](value, self.value)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    settings: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_SETTINGS))
    calibration: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<memory>"

    def setting(self, name: str) -> float:
        return float(self.settings.get(name, DEFAULT_SETTINGS[name]))


def _parse_rule(d: Any, i: int, where: str) -> Rule:
    w = f"{where} rule #{i}"
    if not isinstance(d, Mapping):
        raise RulesError(f"{w}: expected a table, found {type(d).__name__}")
    unknown = sorted(set(d) - _RULE_KEYS)
    if unknown:
        raise RulesError(f"{w}: unknown keys {unknown}; expected only {sorted(_RULE_KEYS)}")
    for key in ("probe", "metric", "op", "value"):
        if key not in d:
            raise RulesError(f"{w}: missing key {key!r}")
    try:
        pat = re.compile(d["probe"])
    except (re.error, TypeError) as e:
        raise RulesError(f"{w}: probe: expected a regular expression, found {d['probe']!r} ({e})") from None
    if not any(pat.fullmatch(n) for n in _NORMATIVE):
        raise RulesError(f"{w}: probe {d['probe']!r} matches no probe name of the normative list "
                         f"(e.g. 'layers.3.attn.q', 'logits'); unknown probe")
    if d["metric"] not in KNOWN_METRICS:
        raise RulesError(f"{w}: metric: expected one of the harness's metrics (e.g. cosine, rel_diff, kl_mean, "
                         f"router_jaccard_mean), found {d['metric']!r}")
    if d["op"] not in OPS:
        raise RulesError(f"{w}: op: expected one of {list(OPS)}, found {d['op']!r}")
    v = d["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(float(v)):
        raise RulesError(f"{w}: value: expected a number, found {v!r}")
    for key, allowed in (("pair", PAIRS), ("compare_mode", RECORD_MODES), ("profile", PROFILES)):
        if d.get(key) is not None and d[key] not in allowed:
            raise RulesError(f"{w}: {key}: expected one of {list(allowed)}, found {d[key]!r}")
    if d.get("prompt") is not None:
        try:
            re.compile(d["prompt"])
        except (re.error, TypeError) as e:
            raise RulesError(f"{w}: prompt: expected a regular expression, found {d['prompt']!r} ({e})") from None
    return Rule(probe=d["probe"], metric=d["metric"], op=d["op"], value=float(v), pair=d.get("pair"),
                compare_mode=d.get("compare_mode"), profile=d.get("profile"), prompt=d.get("prompt"),
                note=str(d.get("note", "")), index=i)


def parse_rules(text: str, source: str = "<text>") -> RuleSet:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RulesError(f"rules {source}: expected valid TOML, found a syntax error: {e}") from None
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise RulesError(f"rules {source}: unknown top-level keys {unknown}; expected {sorted(_TOP_KEYS)}")
    raw = data.get("rule", [])
    if not isinstance(raw, list) or not raw:
        raise RulesError(f"rules {source}: expected at least one [[rule]] table, found none")
    settings = dict(DEFAULT_SETTINGS)
    for k, v in (data.get("settings") or {}).items():
        if k not in DEFAULT_SETTINGS:
            raise RulesError(f"rules {source}: [settings] {k!r}: expected one of {sorted(DEFAULT_SETTINGS)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RulesError(f"rules {source}: [settings] {k}: expected a number, found {v!r}")
        settings[k] = float(v)
    return RuleSet(tuple(_parse_rule(d, i, f"rules {source}") for i, d in enumerate(raw)), settings,
                   dict(data.get("calibration") or {}), source)


def load_rules(path: str | Path | None = None, checkpoint: str | Path | None = None) -> RuleSet:
    """A thresholds file; without ``path`` the shipped one of ``checkpoint`` (default_rules_path)."""
    p = Path(path) if path is not None else default_rules_path(checkpoint)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RulesError(f"rules: expected a TOML file at {p}, found none") from None
    return parse_rules(text, str(p))


class _Index:
    """Records as numpy columns plus category codes, so each rule is a few array operations (a
    pandas filter per rule cost ~2 ms, i.e. 1 s for the default file's ~500 rules)."""

    def __init__(self, df: pd.DataFrame) -> None:
        self.n = len(df)
        self.value = df["value"].to_numpy(dtype=float)
        self.codes: dict[str, np.ndarray] = {}
        self.cats: dict[str, list[Any]] = {}
        for col in ("metric", "probe", "pair", "compare_mode", "profile", "prompt_id"):
            cat = pd.Categorical(df[col])
            self.codes[col], self.cats[col] = cat.codes, list(cat.categories)
        order = np.argsort(self.codes["metric"], kind="stable")
        bounds = np.searchsorted(self.codes["metric"][order], np.arange(len(self.cats["metric"]) + 1))
        self.by_metric = {m: order[bounds[i]:bounds[i + 1]] for i, m in enumerate(self.cats["metric"])}

    def matches(self, col: str, idx: np.ndarray, accept: Callable[[Any], bool]) -> np.ndarray:
        ok = np.fromiter((accept(c) for c in self.cats[col]), dtype=bool, count=len(self.cats[col]))
        return ok[self.codes[col][idx]]

    def select(self, r: Rule) -> np.ndarray:
        idx = self.by_metric.get(r.metric)
        if idx is None or not len(idx):
            return np.empty(0, dtype=np.int64)
        pat = re.compile(r.probe)
        keep = self.matches("probe", idx, lambda p: bool(pat.fullmatch(p)))
        for col, want in (("pair", r.pair), ("compare_mode", r.compare_mode), ("profile", r.profile)):
            if want is not None:
                keep &= self.matches(col, idx, lambda v, w=want: v == w)
        if r.prompt is not None:
            ppat = re.compile(r.prompt)
            keep &= self.matches("prompt_id", idx, lambda v: bool(ppat.fullmatch(v)))
        return idx[keep]


def judge(df: pd.DataFrame, rules: RuleSet | Sequence[Rule]) -> pd.DataFrame:
    """One row per (record, matching rule): the record's columns plus ``rule`` (index), ``op``,
    ``threshold`` and ``passed``. NaN values never pass."""
    rule_list = rules.rules if isinstance(rules, RuleSet) else tuple(rules)
    if df.empty:
        return df.assign(rule=pd.Series(dtype=int), op=pd.Series(dtype=str), threshold=pd.Series(dtype=float),
                         passed=pd.Series(dtype=bool))
    ix = _Index(df)
    rows, rule_ids, ops, thresholds, passed = [], [], [], [], []
    for r in rule_list:
        hit = ix.select(r)
        if not len(hit):
            continue
        v = ix.value[hit]
        with np.errstate(invalid="ignore"):
            ok = OPS[r.op](v, r.value) & ~np.isnan(v)
        rows.append(hit)
        rule_ids.append(np.full(len(hit), r.index))
        ops += [r.op] * len(hit)
        thresholds.append(np.full(len(hit), r.value))
        passed.append(ok)
    if not rows:
        return df.iloc[0:0].assign(rule=pd.Series(dtype=int), op=pd.Series(dtype=str),
                                   threshold=pd.Series(dtype=float), passed=pd.Series(dtype=bool))
    out = df.iloc[np.concatenate(rows)].copy()
    out["rule"] = np.concatenate(rule_ids)
    out["op"] = ops
    out["threshold"] = np.concatenate(thresholds)
    out["passed"] = np.concatenate(passed)
    return out


def audit_rules(start_index: int) -> tuple[Rule, ...]:
    """The audit's verdict, built in and not calibrated: every kernel call within its analytic bound and
    every served weight equal to the reference's dequantization (docs/audit.md)."""
    why = "exact: the oracle's analytic bound per element (parity.audit), not a learned threshold"
    return tuple(Rule(probe=".*", metric=m, op="<=", value=0.0, pair="bug_budget", compare_mode=AUDIT_MODE,
                      note=why, index=start_index + i)
                 for i, m in enumerate(("audit_violations", "weight_mismatches")))


def with_audit_rules(rules: RuleSet, audited: bool) -> RuleSet:
    """The rules a run is judged by. With audit records (``audited``) the bug-budget column is judged by
    the audit alone: its distribution rules (cosine, rel_diff, KL of emulated vs kernel) are dropped from
    the verdict and their statistics stay in the records and the report as information."""
    if not audited:
        return rules
    kept = tuple(r for r in rules.rules if r.pair != "bug_budget")
    start = max((r.index for r in rules.rules), default=-1) + 1
    return RuleSet(kept + audit_rules(start), rules.settings, rules.calibration, rules.source)


def passing_threshold(r: Rule, values: pd.Series) -> float | None:
    """The threshold at which every matched value would have passed (Polygraphy's 'minimum passing
    tolerance'); None for ``==`` rules or when a value is NaN (nothing would pass)."""
    vals = values.astype(float)
    if r.op == "==" or vals.isna().any() or vals.empty:
        return None
    return float(vals.min()) if r.op in (">=", ">") else float(vals.max())


@dataclass(frozen=True)
class RuleOutcome:
    rule: Rule
    matched: int
    failed: int
    worst: float | None          # the matched value farthest on the failing side
    would_pass_at: float | None  # see passing_threshold
    worst_record: Mapping[str, Any] | None

    @property
    def passed(self) -> bool:
        return self.failed == 0


def outcomes(judged: pd.DataFrame, rules: RuleSet) -> list[RuleOutcome]:
    """Per rule: how many records it judged, how many failed, the worst value and where."""
    groups = {k: g for k, g in judged.groupby("rule", sort=False)} if not judged.empty else {}
    out = []
    for r in rules.rules:
        hit = groups.get(r.index)
        if hit is None:
            out.append(RuleOutcome(r, 0, 0, None, None, None))
            continue
        vals = hit["value"].to_numpy(dtype=float)
        passed = hit["passed"].to_numpy(dtype=bool)
        if np.isnan(vals).any():
            worst_pos = int(np.isnan(vals).argmax())
        elif r.op in (">=", ">"):
            worst_pos = int(vals.argmin())
        elif r.op in ("<=", "<"):
            worst_pos = int(vals.argmax())
        else:
            worst_pos = int((~passed).argmax())
        row = hit.iloc[worst_pos]
        out.append(RuleOutcome(r, len(hit), int((~passed).sum()), float(vals[worst_pos]),
                               passing_threshold(r, hit["value"]), row.to_dict()))
    return out
