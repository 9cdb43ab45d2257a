"""Attribution study: for each bug-zoo fault, would the flip tables or the floor search have blamed a
precision choice instead of the bug?

Each fault (``parity.bugzoo`` registry) is injected into every native model the tools build — the
floor column's plan model, and the logic column's all-BF16 model — and the tools are run as a user
would, with the fault present:

* **logic column** (reference bf16 profile in FP32 <-> native all-fp32, propagated + isolated), judged with the
  parity thresholds: does it flag the fault regardless of plan? (A fault acting only on an FP4 path,
  or a kernel fault, cannot show here: there is no FP4 in the logic column.)
* **rescue / damage tables** with the fault: the fault's *excess* KL in a plan is KL(faulty) -
  KL(clean) for the same plan (paired SE over prompts). Promoting class c **fixes** the metric when
  the fault has a significant excess in ``all-fp4`` and rescue-c removes at least
  ``FIX_FRACTION`` of it; demoting c **shows** the fault when damage-c's excess exceeds
  ``all-bf16``'s significantly. Either way the table points at c's precision, not at the bug.
* **floor search** with the fault, same budget: classes in the faulty floor and not in the clean one
  are promoted *because of the bug* — the search would report them as the precision floor.

Verdicts: ``caught by logic`` (the logic column flags it; the tables' blame, if any, is listed too),
``misattributed`` (the logic column is silent and a table or the search blames a class),
``visible, unattributed`` (metrics move, nothing blamed: e.g. the budget cannot be met at all),
``invisible to logic and tables`` (no significant excess KL in either base plan on this checkpoint
and prompt set: only the bug-budget column can catch it). A fault *moves the metrics* when its
excess in ``all-fp4`` or ``all-bf16`` is beyond 2 SE; the search's extra promotions count as blame
only then.

Kernel faults (a faulty backend) are injected by moving the model's dispatchers onto that backend:
the tables then measure R <-> N, as a user running them on the kernels would.

``python -m precision_floor.attribution [--checkpoint] [--faults a,b] [--records DIR] [--resume]``
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from dsv4.plan import PrecisionPlan
    from parity.bugzoo.registry import Fault
    from parity.rules import RuleSet
    from parity.runner import ModelLoaders
    from .evaluate import Evaluator, Scorer



from .flips import DIRECTIONS, FlipTables, check_classes, flip_plan, paired_delta, per_prompt_kl, run_flips, \
    significant
from .search import STRATEGIES, Budget, SearchResult, floor_search

DAMAGE_BASE = "all-bf16"     # the damage tables' base (all-bf16 except c in FP4); the logic column is FP32
LOGIC_MODES = ("propagated", "isolated")
# Promoting c 'fixes' the fault when at most this fraction of its all-fp4 excess KL remains.
FIX_FRACTION = 0.2
VERDICTS = ("caught by logic", "misattributed", "visible, unattributed", "invisible to logic and tables")
# The plans whose excess decides whether a fault moves the floor metrics at all: the two bases, not
# every flip plan (with ~20 plans one would cross 2 SE by chance).
BASES = ("all-fp4", "all-bf16")


class FaultLoaders:
    """Model loaders with ``fault`` applied to every native model for its lifetime (models are built
    one at a time, so the previous model's patch is undone when the next is loaded). A fault that
    cannot apply to a plan (e.g. forcing a class to FP4 that the plan already has in FP4) leaves
    that model clean; ``applied[plan name]`` says which happened."""

    def __init__(self, fault: Fault, base: ModelLoaders | None = None) -> None:
        from parity.runner import DefaultLoaders

        self.fault, self.base = fault, base or DefaultLoaders()
        self.applied: dict[str, dict[str, Any]] = {}
        self._stack: contextlib.ExitStack | None = None

    def reference(self, path: str, **kw: Any) -> Any:
        return self.base.reference(path, **kw)

    def native(self, path: str, *, plan: Any, backend: str, device: str, device_map: Any) -> Any:
        from parity.bugzoo.registry import FaultTargetError

        self.close()
        model = self.base.native(path, plan=plan, backend=backend, device=device, device_map=device_map)
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self.fault(model))
            self.applied[model.plan.name] = {"applied": True, "reason": ""}
        except FaultTargetError as e:
            self.applied[model.plan.name] = {"applied": False, "reason": str(e)}
        self._stack = stack
        return model

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def manifest_extra(self, plan: PrecisionPlan) -> dict[str, Any]:
        return {"fault_applied": dict(self.applied)}


def resolve_faults(names: Sequence[str] | None) -> list[Fault]:
    from parity.bugzoo.registry import get_fault, list_faults

    if not names:
        return list_faults()
    return [get_fault(n) for n in names]


def _excess(faulty: Scorer, clean: Scorer, plan: PrecisionPlan) -> tuple[float, float]:
    return paired_delta(per_prompt_kl(faulty.evaluate(plan).records), per_prompt_kl(clean.evaluate(plan).records))


@dataclass
class FaultStudy:
    fault: Fault
    logic_flags: bool
    logic_divergence: str
    applied: dict[str, dict[str, Any]]
    excess: dict[str, tuple[float, float]]          # plan name -> (excess KL, paired SE)
    rescue_fixes: list[str]
    damage_shows: list[str]
    search: SearchResult | None
    clean_floor: list[str]
    tables: FlipTables | None = None

    @property
    def search_blames(self) -> list[str]:
        if self.search is None or not self.search.met:
            return []
        return [c for c in self.search.floor_set if c not in self.clean_floor]

    @property
    def moves_metrics(self) -> bool:
        """A significant excess KL in a base plan: the fault is visible in the tools' metric at all."""
        return any(significant(*self.excess[b]) and self.excess[b][0] > 0 for b in BASES if b in self.excess)

    @property
    def blamed(self) -> list[str]:
        """Classes the tools would name: the tables' (significance-tested) ones, and the search's extra
        promotions when the fault moves the metrics (otherwise a different floor is the greedy path
        reacting to noise of the size of the SE, not to the fault)."""
        extra = self.search_blames if self.moves_metrics else []
        return sorted(set(self.rescue_fixes) | set(self.damage_shows) | set(extra))

    @property
    def verdict(self) -> str:
        if self.logic_flags:
            return VERDICTS[0]
        if self.blamed:
            return VERDICTS[1]
        return VERDICTS[2] if self.moves_metrics else VERDICTS[3]

    def row(self) -> dict[str, Any]:
        e0, se0 = self.excess.get("all-fp4", (math.nan, math.nan))
        s = self.search
        return {"fault": self.fault.name, "column": self.fault.column, "layer": self.fault.layer,
                "component": self.fault.component, "description": self.fault.description,
                "logic_flags": self.logic_flags, "logic_divergence": self.logic_divergence,
                "not_applicable_plans": sorted(p for p, a in self.applied.items() if not a["applied"]),
                "excess_kl": e0, "excess_kl_se": se0,
                "excess_kl_all_bf16": self.excess.get(DAMAGE_BASE, (math.nan, math.nan))[0],
                "excess_kl_all_bf16_se": self.excess.get(DAMAGE_BASE, (math.nan, math.nan))[1],
                "moves_metrics": self.moves_metrics,
                "rescue_fixes": self.rescue_fixes, "damage_shows": self.damage_shows,
                "search_met": bool(s.met) if s else False, "search_floor": s.floor_set if s else [],
                "search_kl": s.score.kl if s else math.nan, "clean_floor": self.clean_floor,
                "search_blames": self.search_blames, "blamed": self.blamed, "verdict": self.verdict}


def logic_check(ev: Evaluator, rules: RuleSet) -> tuple[bool, str]:
    """(flags, first divergence) of the logic column of ``ev`` (propagated + isolated), judged."""
    from dsv4.plan import PrecisionPlan
    from parity.threeway import LOGIC_PLAN
    from parity.verdict import evaluate as judge_verdict
    from .evaluate import Evaluator

    logic = Evaluator(ev.source, ev.prompts, ev.store, profile="bf16", modes=LOGIC_MODES, loaders=ev.loaders,
                      fault=ev.context.fault, device=ev.device, settings=ev.settings, reuse=ev.reuse,
                      on_evaluated=ev.on_evaluated, manifest_extra=ev.manifest_extra)
    res = logic.evaluate(PrecisionPlan.preset(LOGIC_PLAN), columns=("logic",))
    ev.computed, ev.loaded = ev.computed + logic.computed, ev.loaded + logic.loaded
    verdict = judge_verdict(res.records, rules)
    div = verdict.first_divergence.get("logic")
    short = f"{div.probe}: {div.metric} {div.value:.3g} (rule {div.op} {div.threshold:g})" if div else ""
    return not verdict.pair_passed("logic"), short


def study_fault(clean: Evaluator, fault: Fault, budget: Budget | None, classes: Sequence[str],
                directions: Sequence[str], rules: RuleSet, clean_search: SearchResult | None,
                strategy: str = "ranked") -> FaultStudy:
    """One fault: its logic check, tables and search, against the clean ones (computed or loaded)."""
    from dsv4.plan import PrecisionPlan

    loaders = FaultLoaders(fault, clean.loaders)
    faulty = clean.with_fault(fault.name, loaders, loaders.manifest_extra)
    try:
        flags, div = logic_check(faulty, rules)
        tables = run_flips(faulty, classes, directions)
        plans = [PrecisionPlan.preset(DIRECTIONS[d][0]) for d in directions]
        plans += [flip_plan(d, c) for d in directions for c in classes]
        excess = {p.name: _excess(faulty, clean, p) for p in plans}
        search = floor_search(faulty, budget, classes, strategy) if budget else None
    finally:
        loaders.close()
        clean.computed, clean.loaded = clean.computed + faulty.computed, clean.loaded + faulty.loaded
    e0, se0 = excess.get("all-fp4", (math.nan, math.nan))
    fixes: list[str] = []
    if "rescue" in directions and significant(e0, se0) and e0 > 0:
        fixes = [c for c in classes if excess[flip_plan("rescue", c).name][0] <= FIX_FRACTION * e0]
    shows: list[str] = []
    if "damage" in directions:
        eb, _ = excess[DAMAGE_BASE]
        for c in classes:
            d, se = excess[flip_plan("damage", c).name]
            if significant(d - eb, se) and d - eb > 0:
                shows.append(c)
    # Which plans the fault could patch: from this session's builds, and from the manifests of
    # evaluations loaded from the store (a resumed study builds no model for them).
    applied: dict[str, dict[str, Any]] = {}
    for ev in faulty.evaluations():
        applied.update(ev.manifest.get("fault_applied", {}))
    applied.update(loaders.applied)
    return FaultStudy(fault, flags, div, applied, excess, fixes, shows, search,
                      clean_search.floor_set if clean_search else [], tables)


@dataclass
class AttributionResult:
    clean_logic_flags: bool
    clean_floor: list[str]
    budget: Budget | None
    strategy: str = "ranked"
    studies: list[FaultStudy] = field(default_factory=list)

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame([s.row() for s in self.studies])

    def to_json(self) -> dict[str, Any]:
        rows = []
        for r in self.frame().to_dict(orient="records"):
            rows.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
        return {"clean_logic_flags": self.clean_logic_flags, "clean_floor": self.clean_floor,
                "strategy": self.strategy,
                "budget": {"kl": self.budget.kl, "top1": self.budget.top1} if self.budget else None,
                "fix_fraction": FIX_FRACTION, "faults": rows}


def run_attribution(clean: Evaluator, faults: Sequence[Fault], *, budget: Budget | None = Budget(),
                    classes: Sequence[str] | None = None, directions: Sequence[str] = tuple(DIRECTIONS),
                    rules: RuleSet | None = None, strategy: str = "ranked") -> AttributionResult:
    """The study over ``faults``; the clean run of every table is computed (or loaded) once. The
    search defaults to the ``ranked`` strategy (at most 2n evaluations per fault: a fault's excess
    KL sends the steepest search through up to n(n+1)/2 plans); clean and faulty use the same."""
    from parity.rules import load_rules
    from .errors import FloorInputError

    classes = check_classes(classes)
    bad = [d for d in directions if d not in DIRECTIONS]
    if bad:
        raise FloorInputError(f"directions: expected a subset of {list(DIRECTIONS)}, found {bad}")
    rules = rules or load_rules(None, clean.source.spec)
    clean_flags, _ = logic_check(clean, rules)
    run_flips(clean, classes, directions)      # the clean tables every excess is measured against
    clean_search = floor_search(clean, budget, classes, strategy) if budget else None
    out = AttributionResult(clean_flags, clean_search.floor_set if clean_search else [], budget, strategy)
    for f in faults:
        out.studies.append(study_fault(clean, f, budget, classes, directions, rules, clean_search, strategy))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import add_common, open_session, run_tool
    from .search import DEFAULT_BUDGET_KL, DEFAULT_BUDGET_TOP1

    p = argparse.ArgumentParser(prog="python -m precision_floor.attribution", description=__doc__.split("\n\n")[0])
    add_common(p)
    p.add_argument("--faults", default=None, help="comma-separated fault names (default: every registered fault)")
    p.add_argument("--faults-module", action="append", default=[], metavar="M",
                   help="import this module (dotted name or .py file) first; it registers its own faults")
    p.add_argument("--classes", default=None, help="comma-separated classes of the tables and search (default: all)")
    p.add_argument("--budget-kl", type=float, default=DEFAULT_BUDGET_KL,
                   help=f"floor-search budget, first-token KL in nats (default {DEFAULT_BUDGET_KL})")
    p.add_argument("--budget-top1", type=float, default=DEFAULT_BUDGET_TOP1,
                   help=f"floor-search budget, first-token top-1 agreement (default {DEFAULT_BUDGET_TOP1})")
    p.add_argument("--no-search", action="store_true", help="flip tables only (skip the floor search per fault)")
    p.add_argument("--strategy", choices=STRATEGIES, default="ranked", help="floor-search strategy (default ranked)")
    p.add_argument("--directions", default="rescue,damage", help="flip directions run per fault")
    args = p.parse_args(argv)
    from .render import attribution_table

    def body(console) -> int:
        from parity.bugzoo.registry import load_faults_module
        from .constants import FLIP_CLASSES

        for m in args.faults_module:
            load_faults_module(m)
        session = open_session(args, console)
        faults = resolve_faults(args.faults.split(",") if args.faults else None)
        classes = check_classes(args.classes.split(",")) if args.classes else None
        budget = None if args.no_search else Budget(args.budget_kl, args.budget_top1)
        result = run_attribution(session.evaluator, faults, budget=budget, classes=classes,
                                 directions=[d for d in args.directions.split(",") if d], strategy=args.strategy)
        session.store.write_json("attribution", {**session.header(), "classes": list(classes or FLIP_CLASSES),
                                                 **result.to_json()})
        console.print(attribution_table(result.frame()))
        session.finish(console)
        return 0

    return run_tool(body, args)


if __name__ == "__main__":
    sys.exit(main())
