"""Run the bug zoo: for each fault one three-way run with the fault patched into the native model of
its column, judged with the thresholds unchanged; plus a clean row that must raise no alarm.

Per fault, only what it needs runs: its column (a bug-budget fault also runs the floor column, the
emulated anchor of the kernel side) in its modes (isolated by default: localization reads the
isolated first divergence). The clean row runs every column the faults use, in both modes. The
reference never gets a fault and runs once per prompt for the whole zoo (the harness's reference
cache; a temporary one unless ``reference_cache`` is given).

JSON summary (``--json``; rendered by precision_floor/report), ``schema = "parity.bugzoo/1"``::

    {
      "schema": "parity.bugzoo/1", "code_version": str, "device": str, "wall_seconds": float,
      "passed": bool,                      # every fault caught + column right + localized, clean row quiet
      "checkpoint": {"spec": str, "config": str, "fingerprint": str, "seed": int | null},
      "plan": {"name", "base", "components"}, "profile": str,
      "rules": {"source": str, "count": int},
      "prompt_set": str, "prompts": [{"id": str, "mode": str, "tokens": int}],
      "held_out": {"seed": bool, "prompts": bool, "calibration_seeds": [int], "shared_prompt_ids": [str]},
      "rows": [                            # the clean row first (fault = null), then one per fault
        {
          "fault": str | null, "description": str, "module": str,
          "expected": {"column": str, "layer": int | null, "component": str, "localization": [str],
                       "modes": [str], "backend": str | null} | null,
          "run_id": str, "columns_run": [str], "modes": [str], "backend": str | null,
          "columns_alarmed": [str],          # columns with at least one failed judgement
          "caught": bool,                    # the expected column alarmed (clean row: false)
          "column_ok": bool,                 # exactly the expected column alarmed (clean row: none did)
          "caught_by": Judgement | null,     # the strongest failure in the expected column (see below)
          "failed_judgements": int, "failed_rules": int,
          "first_divergence": Divergence | null,   # isolated, the expected column
          "localized": bool | null,          # first divergence names the expected layer and a class of
                                             # "localization"; null for the clean row
          "passed": bool, "seconds": float, "kernels_missing": [str], "error": str | null
        }
      ]
    }

    Judgement  = {"pair", "compare_mode", "probe", "layer", "component", "metric", "value", "op",
                  "threshold", "ratio", "prompt_id", "rule"}
    Divergence = Judgement without "rule" (same fields as parity.verdict.Divergence, plus "ratio")

``ratio`` says how far past its threshold a value is: ``value / threshold`` for ``<=`` rules and
``(1 - value) / (1 - threshold)`` for ``>=`` rules (similarities); null for exact ``==`` rules,
which are ranked first (a categorical failure, e.g. hash routing) when choosing ``caught_by``.
Non-finite numbers are written as the strings "inf", "-inf", "nan".
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from dsv4.plan import PrecisionPlan
from dsv4.prompts import holdout_prompt_path, load_prompt_set, shipped_prompt_set

from ..env import code_version, device_name
from ..errors import ParityInputError
from ..inputs import EncodedPrompt, encode_prompts
from ..records import COMPARE_MODES, decode_value, json_safe, to_frame
from ..rules import RuleSet
from ..runner import DefaultLoaders, ModelLoaders
from ..source import CheckpointSource
from ..threeway import EMULATED, Progress, RunSpec, resolve_kernel_backend, run_threeway, settings_from_rules
from ..verdict import Divergence, Verdict, evaluate
from .backends import CLEAN_KERNEL, installed
from .registry import Fault, FaultTargetError

SCHEMA = "parity.bugzoo/1"
log = logging.getLogger(__name__)


@dataclass
class ZooSpec:
    source: CheckpointSource
    prompts: Sequence[EncodedPrompt]
    rules: RuleSet
    prompt_set: str = ""
    plan: PrecisionPlan = field(default_factory=lambda: PrecisionPlan.preset("default"))
    profile: str = "bf16"
    device: str = "cpu"
    backend: str = "auto"          # kernel backend of bug-budget faults that bring none, and of the clean row
    reference_cache: Path | None = None
    clean: bool = True


@dataclass
class ZooRow:
    fault: Fault | None
    run_id: str
    columns_run: list[str]
    modes: list[str]
    backend: str | None
    columns_alarmed: list[str]
    caught: bool
    column_ok: bool
    caught_by: dict[str, Any] | None
    failed_judgements: int
    failed_rules: int
    first_divergence: dict[str, Any] | None
    localized: bool | None
    seconds: float
    kernels_missing: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def name(self) -> str:
        return self.fault.name if self.fault else "clean"

    @property
    def passed(self) -> bool:
        if self.error is not None:
            return False
        if self.fault is None:
            return not self.columns_alarmed and not self.kernels_missing
        return self.caught and self.column_ok and bool(self.localized)

    def to_dict(self) -> dict[str, Any]:
        f = self.fault
        return {"fault": f.name if f else None, "description": f.description if f else "no fault: must raise no alarm",
                "module": f.module if f else "", "expected": f.expectation() if f else None,
                "run_id": self.run_id, "columns_run": self.columns_run, "modes": self.modes, "backend": self.backend,
                "columns_alarmed": self.columns_alarmed, "caught": self.caught, "column_ok": self.column_ok,
                "caught_by": self.caught_by, "failed_judgements": self.failed_judgements,
                "failed_rules": self.failed_rules, "first_divergence": self.first_divergence,
                "localized": self.localized, "passed": self.passed, "seconds": self.seconds,
                "kernels_missing": self.kernels_missing, "error": self.error}


@dataclass
class ZooResult:
    spec: ZooSpec
    rows: list[ZooRow]
    records: list[dict[str, Any]]
    wall_seconds: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def summary(self) -> dict[str, Any]:
        s, src = self.spec, self.spec.source
        return json_safe({
            "schema": SCHEMA, "code_version": code_version(), "device": device_name(s.device),
            "wall_seconds": self.wall_seconds, "passed": self.passed,
            "checkpoint": {"spec": src.spec, "config": src.config_name, "fingerprint": src.fingerprint,
                           "seed": src.seed},
            "plan": s.plan.to_dict(), "profile": s.profile,
            "rules": {"source": s.rules.source, "count": len(s.rules.rules)},
            "prompt_set": s.prompt_set,
            "prompts": [{"id": p.id, "mode": p.mode, "tokens": p.n_tokens} for p in s.prompts],
            "held_out": held_out(s),
            "rows": [r.to_dict() for r in self.rows],
        })


class FaultLoaders:
    """Wraps loaders: the reference is passed through untouched; each native model of the fault's
    column is patched by the fault for as long as ``stack`` is open."""

    def __init__(self, base: ModelLoaders, fault: Fault, stack: contextlib.ExitStack) -> None:
        self.base, self.fault, self.stack = base, fault, stack

    def reference(self, path: str, **kw: Any) -> Any:
        return self.base.reference(path, **kw)

    def native(self, path: str, *, plan: Any, backend: str, device: str,
               device_map: Mapping[Any, str] | None) -> Any:
        # logic / floor faults patch the emulated side of their column; a kernel fault the kernel side
        kernel_side = backend != EMULATED
        ours = kernel_side == (self.fault.column == "bug_budget")
        faulty = self.fault.checkpoint(path) if ours and self.fault.checkpoint is not None else None
        model = self.base.native(faulty or path, plan=plan, backend=backend, device=device, device_map=device_map)
        if faulty is not None and hasattr(model, "fingerprint"):
            # a weight / loader bug: the faulty copy is what loaded, deliberately; the run's guard against
            # a loader serving another checkpoint compares with the source's fingerprint, kept beside it
            from dsv4.checkpoint import open_checkpoint

            model.faulty_fingerprint, model.fingerprint = model.fingerprint, open_checkpoint(path).fingerprint()
        if ours:
            self.stack.enter_context(self.fault(model))
        return model


# ---- judging -------------------------------------------------------------------------------------
def excess_ratio(value: float, op: str, threshold: float) -> float | None:
    """How far past its threshold a value is (> 1 = failing); None for exact rules."""
    if op == "==":
        return None
    if op in ("<=", "<"):
        return value / threshold if threshold > 0 else (math.inf if value > 0 else 0.0)
    gap, allowed = 1.0 - value, 1.0 - threshold
    return gap / allowed if allowed > 0 else (math.inf if gap > 0 else 0.0)


def _judgement(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: row[k] for k in ("pair", "compare_mode", "probe", "component", "metric", "op", "prompt_id")}
    out["layer"] = None if pd.isna(row["layer"]) else int(row["layer"])
    out["value"], out["threshold"] = float(row["value"]), float(row["threshold"])
    out["ratio"] = excess_ratio(out["value"], out["op"], out["threshold"])
    out["rule"] = int(row["rule"])
    return out


def strongest_failure(judged: pd.DataFrame, pair: str) -> tuple[dict[str, Any] | None, int]:
    """(the failure farthest past its threshold in ``pair``, number of failed judgements there).
    Exact-rule failures rank first; NaN values count as infinitely far."""
    fail = judged[(~judged["passed"]) & (judged["pair"] == pair)]
    if fail.empty:
        return None, 0
    best, key = None, None
    for _, row in fail.iterrows():
        r = excess_ratio(float(row["value"]), row["op"], float(row["threshold"]))
        k = (1, math.inf) if r is None else (0, math.inf if math.isnan(r) else r)
        if key is None or k > key:
            best, key = row, k
    return _judgement(best), len(fail)


AUDIT_JUDGED = ("audit_violations",)


def audit_bounds_missed(records: Sequence[Mapping[str, Any]], j: Mapping[str, Any]) -> float:
    """The audit's worst |got - expected| / bound at the judged probe and prompt (information records)."""
    vals = [decode_value(r["value"]) for r in records if r["metric"] == "audit_worst_ratio"
            and r["probe"] == j["probe"] and r["prompt_id"] == j["prompt_id"]]
    return max(vals, default=math.inf)


def _divergence(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"pair": d.pair, "compare_mode": "isolated", "probe": d.probe, "layer": d.layer,
            "component": d.component, "metric": d.metric, "value": d.value, "op": d.op, "threshold": d.threshold,
            "ratio": excess_ratio(d.value, d.op, d.threshold), "prompt_id": d.prompt_id}


def _alarmed(verdict: Verdict, kernels_missing: Mapping[str, list[str]]) -> list[str]:
    return [p for p in verdict.pairs if not verdict.pair_passed(p) or kernels_missing.get(p)]


# ---- running -------------------------------------------------------------------------------------
def _run(spec: ZooSpec, fault: Fault | None, columns: Sequence[str], modes: Sequence[str], backend: str,
         loaders: ModelLoaders, stack: contextlib.ExitStack, progress: Progress | None) -> tuple[Any, Verdict]:
    wrapped = FaultLoaders(loaders, fault, stack) if fault else loaders
    rs = RunSpec(source=spec.source, prompts=spec.prompts, plan=spec.plan, backend=backend, profile=spec.profile,
                 device=spec.device, settings=settings_from_rules(spec.rules), reference_cache=spec.reference_cache,
                 columns=tuple(columns), modes=tuple(modes), fault=fault.name if fault else None)
    result = run_threeway(rs, wrapped, progress).raise_errors()   # a crash is this row's error
    missing = [f"{n}: FP4 kernels never ran: {m}" for n, c in result.columns.items() for m in c.kernels_missing]
    return result, evaluate(to_frame(result.records), spec.rules, missing)


def run_one(spec: ZooSpec, fault: Fault | None, *, loaders: ModelLoaders | None = None,
            progress: Progress | None = None, clean_columns: Sequence[str] = ("logic", "floor", "bug_budget"),
            clean_modes: Sequence[str] = ("isolated",)) -> tuple[ZooRow, list[dict[str, Any]]]:
    """One row of the zoo (``fault=None``: the clean row) and its records."""
    t0 = time.perf_counter()
    loaders = loaders or DefaultLoaders()
    # a fault runs its own column only (for bug_budget, run_threeway adds floor: the emulated anchor)
    columns = list(clean_columns) if fault is None else [fault.column]
    modes = list(clean_modes) if fault is None else list(fault.modes)
    with contextlib.ExitStack() as stack:
        backend = spec.backend
        kernel = fault.backend if fault is not None else None
        real = resolve_kernel_backend(spec.backend, spec.device)[0] if "bug_budget" in columns else None
        if kernel is not None and kernel.around is not None and real is not None:
            kernel, backend = None, real   # the fault is injected around the real kernel's calls (swap_backend)
        if "bug_budget" in columns and kernel is None and real is None:
            kernel = CLEAN_KERNEL     # no kernel backend executes here: a clean copy of emulated stands in
        if kernel is not None:
            backend = stack.enter_context(installed(kernel))
        try:
            result, verdict = _run(spec, fault, columns, modes, backend, loaders, stack, progress)
        except (FaultTargetError, ParityInputError) as e:
            return ZooRow(fault, "", columns, modes, backend, [], False, False, None, 0, 0, None, None,
                          time.perf_counter() - t0, error=str(e)), []
        except Exception as e:  # one row's failure never costs the other rows (they are kept and written)
            log.warning("bug zoo row %s failed", fault.name if fault else "clean", exc_info=True)
            return ZooRow(fault, "", columns, modes, backend, [], False, False, None, 0, 0, None, None,
                          time.perf_counter() - t0, error=f"{type(e).__name__}: {e}"), []
    missing = {n: c.kernels_missing for n, c in result.columns.items()}
    ran = [c for c in ("logic", "floor", "bug_budget") if c in result.columns and result.columns[c].ran]
    alarmed = _alarmed(verdict, missing)
    if fault is None:
        caught_by, n_fail = None, 0
        div, localized, caught, column_ok = None, None, False, not alarmed
    else:
        caught_by, n_fail = strongest_failure(verdict.judged, fault.column)
        div = _divergence(verdict.first_divergence.get(fault.column))
        for j in (caught_by, div):     # an audit failure is "so many analytic bounds missed"
            if j is not None and j["metric"] in AUDIT_JUDGED:
                j["ratio"] = audit_bounds_missed(result.records, j)
        caught = fault.column in alarmed
        column_ok = alarmed == [fault.column]
        localized = div is not None and fault.localizes(div["layer"], div["component"])
    row = ZooRow(fault, result.spec.run_id, ran, modes, backend if "bug_budget" in ran else None, alarmed, caught,
                 column_ok, caught_by, n_fail, len(verdict.failed_rules), div, localized, time.perf_counter() - t0,
                 [m for ms in missing.values() for m in ms])
    return row, result.records


def run_zoo(spec: ZooSpec, faults: Sequence[Fault], *, loaders: ModelLoaders | None = None,
            progress: Progress | None = None, on_row: Callable[[ZooRow], None] | None = None,
            clean_faults: Sequence[Fault] | None = None) -> ZooResult:
    """The clean row (every column the faults use, both modes) and one row per fault.
    ``clean_faults``: the faults whose columns the clean row covers (default ``faults``; a resumed
    zoo measures a subset of the faults but its clean row stands for all of them)."""
    t0 = time.perf_counter()
    rows: list[ZooRow] = []
    records: list[dict[str, Any]] = []
    todo: list[Fault | None] = ([None] if spec.clean else []) + list(faults)
    # The clean row runs every column some fault runs (a bug-budget fault also runs floor), in both
    # modes: a false alarm anywhere would make every "caught" below meaningless.
    used = {c for f in (faults if clean_faults is None else clean_faults)
            for c in (f.column, "floor" if f.column == "bug_budget" else f.column)}
    cols = [c for c in ("logic", "floor", "bug_budget") if c in used] or ["logic", "floor", "bug_budget"]
    modes = list(COMPARE_MODES)
    with contextlib.ExitStack() as stack:
        work = spec
        if spec.reference_cache is None:   # one reference run per prompt for the whole zoo
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bugzoo-ref-"))
            work = dataclasses.replace(spec, reference_cache=Path(tmp))
        for f in todo:
            row, recs = run_one(work, f, loaders=loaders, progress=progress, clean_columns=cols, clean_modes=modes)
            rows.append(row)
            records += recs
            if on_row:
                on_row(row)
    return ZooResult(spec, rows, records, time.perf_counter() - t0)


def held_out(spec: ZooSpec) -> dict[str, Any]:
    """Were the seed and the prompts unseen by the thresholds' calibration? The prompts are compared
    with the set the rules were calibrated on (the standard set unless the file names another)."""
    seeds = [int(s) for s in spec.rules.calibration.get("seeds", [])]
    src = spec.source
    standard = encode_prompts(load_prompt_set(calibration_prompt_set(spec.rules)), src.tokenizer, src.config.vocab_size)
    ids, tokens = {p.id for p in standard}, {p.ids for p in standard}
    # shared by id or by content: a renamed copy of a calibration prompt is not held out either
    shared = sorted(p.id for p in spec.prompts if p.id in ids or p.ids in tokens)
    return {"seed": spec.source.seed not in seeds, "prompts": not shared, "calibration_seeds": seeds,
            "shared_prompt_ids": shared}


def calibration_prompt_set(rules: Any) -> Path | None:
    """The prompt set a thresholds file was calibrated on (None: the standard set). A bare file name
    is one of the shipped sets beside the standard one."""
    name = rules.calibration.get("prompt_set")
    return shipped_prompt_set(name) if name else None


def load_holdout(source: CheckpointSource, path: str | Path | None = None) -> list[EncodedPrompt]:
    """Every prompt of the hold-out set (both modes), encoded for ``source``."""
    return encode_prompts(load_prompt_set(path or holdout_prompt_path()), source.tokenizer, source.config.vocab_size)


__all__ = ["SCHEMA", "ZooSpec", "ZooRow", "ZooResult", "FaultLoaders", "run_zoo", "run_one", "excess_ratio",
           "strongest_failure", "held_out", "holdout_prompt_path", "load_holdout"]
