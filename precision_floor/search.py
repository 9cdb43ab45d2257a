"""Floor search (docs/methods.md §7.2): the smallest set of classes kept in BF16 for the native
model to meet a budget, starting from ``all-fp4``.

0. **Ceiling**: when ``all-fp4`` fails, the plan with every searchable class in BF16 is scored
   first, as a reference point (if it fails too, precision alone probably cannot meet the budget).
1. **Greedy promotion**: while the budget fails, evaluate promoting each remaining class to BF16
   and keep the promotion that lowers first-token KL most (ties: fewer bytes) — ``steepest``, the
   default; or, as AMD Quark AMP does, promote in the order of the rescue table, cumulatively,
   without re-scoring (``ranked``: at most 2n evaluations instead of n(n+1)/2).
2. **Add-then-revert** (Intel Neural Compressor ``mse_v2``): while some promoted class can go back to
   FP4 with the budget still holding, revert the one that saves the most bytes (ties: lower KL).
   Greedy promotion can overshoot — a class promoted early may be redundant once later ones are in.

The budget: first-token KL mean <= ``kl`` and first-token top-1 agreement >= ``top1`` (point
estimates; their standard errors are reported next to them). Every plan visited in either phase is
a point of the Pareto curve (KL vs weight bytes); the front is the set no other visited plan beats
on both axes.

``python -m precision_floor.search [--checkpoint] --budget-kl X --budget-top1 Y [--records DIR] [--resume]``
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from dsv4.plan import PrecisionPlan
    from .evaluate import Evaluation, Evaluator, PlanScore, Scorer




# Defaults for the built-in tiny model: all-fp4 costs a first-token KL of ~0.12 nats there and the
# default plan ~0.018; 0.02 asks for about what the default plan achieves, with fewer BF16 classes.
DEFAULT_BUDGET_KL = 0.02
DEFAULT_BUDGET_TOP1 = 0.99
START = "all-fp4"
# Presets scored beside the search as reference points of the Pareto plot.
REFERENCE_PLANS = ("default", "all-bf16")
STRATEGIES = ("steepest", "ranked")


@dataclass(frozen=True)
class Budget:
    kl: float = DEFAULT_BUDGET_KL
    top1: float = DEFAULT_BUDGET_TOP1

    def __post_init__(self) -> None:
        from .errors import FloorInputError

        if not (self.kl >= 0 and math.isfinite(self.kl)):
            raise FloorInputError(f"--budget-kl: expected a finite KL >= 0 (nats), found {self.kl!r}")
        if not 0.0 <= self.top1 <= 1.0:
            raise FloorInputError(f"--budget-top1: expected an agreement rate in [0, 1], found {self.top1!r}")

    def holds(self, s: PlanScore) -> bool:
        return s.kl <= self.kl and s.top1 >= self.top1

    def describe(self) -> str:
        return f"first-token KL <= {self.kl:g} nats and top-1 agreement >= {self.top1:g}"


@dataclass(frozen=True)
class Step:
    phase: str               # start | ceiling (reference point) | promote | revert
    cls: str | None
    plan: PrecisionPlan
    score: PlanScore
    candidates: tuple[tuple[str, PlanScore], ...] = ()

    def row(self) -> dict[str, Any]:
        return {"phase": self.phase, "class": self.cls, "holds": None, **self.score.row(),
                "candidates": {c: s.kl for c, s in self.candidates}}


@dataclass
class SearchResult:
    budget: Budget
    floor: PrecisionPlan
    score: PlanScore
    met: bool
    steps: list[Step]
    visited: dict[str, PlanScore] = field(default_factory=dict)   # plan key -> score
    start_bytes: int = 0
    strategy: str = "steepest"

    @property
    def floor_set(self) -> list[str]:
        """Classes the floor keeps in BF16 (of the flippable ones)."""
        from .constants import FLIP_CLASSES

        return [c for c in FLIP_CLASSES if self.floor[c] == "bf16"]

    def visited_frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = [s.row() for s in self.visited.values()]
        df = pd.DataFrame(rows)
        df["extra_bytes"] = df["bytes"] - self.start_bytes
        df["pareto"] = pareto_front(df)
        df["floor"] = df["plan_key"] == self.floor.key()
        return df.sort_values(["bytes", "kl"]).reset_index(drop=True)

    def steps_frame(self) -> pd.DataFrame:
        import pandas as pd

        rows = []
        for st in self.steps:
            r = st.row()
            r["holds"] = self.budget.holds(st.score)
            rows.append(r)
        return pd.DataFrame(rows)

    def to_json(self) -> dict[str, Any]:
        v = self.visited_frame()
        return {"budget": {"kl": self.budget.kl, "top1": self.budget.top1, "describe": self.budget.describe()},
                "strategy": self.strategy,
                "met": self.met, "floor_plan": self.floor.to_dict(), "floor_set": self.floor_set,
                "floor": self.score.row(), "start": START, "start_bytes": self.start_bytes,
                "extra_bytes": self.score.bytes - self.start_bytes,
                "steps": _clean(self.steps_frame().to_dict(orient="records")),
                "visited": _clean(v.to_dict(orient="records"))}


def _clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def fix(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return None
        if hasattr(v, "item"):          # numpy scalars from pandas
            return v.item()
        return v
    return [{k: fix(v) for k, v in r.items()} for r in rows]


def pareto_front(df: pd.DataFrame, x: str = "bytes", y: str = "kl") -> list[bool]:
    """True for rows no other row beats on both axes (<= on both, < on one): the lower-left front."""
    pts = list(zip(df[x].astype(float), df[y].astype(float)))
    return [not any((bx <= ax and by <= ay) and (bx < ax or by < ay) for bx, by in pts) for ax, ay in pts]


def _better(a: tuple[str, PlanScore], b: tuple[str, PlanScore]) -> bool:
    from .constants import FLIP_CLASSES

    return (a[1].kl, a[1].bytes, FLIP_CLASSES.index(a[0])) < (b[1].kl, b[1].bytes, FLIP_CLASSES.index(b[0]))


def floor_search(ev: Scorer, budget: Budget, classes: Sequence[str] | None = None,
                 strategy: str = "steepest") -> SearchResult:
    """``strategy``: ``steepest`` re-scores every remaining class at each step (up to n(n+1)/2
    evaluations); ``ranked`` promotes in the order of the rescue table (at most 2n)."""
    from dsv4.plan import PrecisionPlan
    from .errors import FloorInputError
    from .constants import FLIP_CLASSES
    from .flips import check_classes

    if strategy not in STRATEGIES:
        raise FloorInputError(f"search strategy: expected one of {list(STRATEGIES)}, found {strategy!r}")
    classes = check_classes(classes)
    visited: dict[str, PlanScore] = {}
    # batches known ahead, spread over the ranks under torchrun (a scorer without prefetch: one process)
    prefetch = getattr(ev, "prefetch", lambda plans: None)

    def score(plan: PrecisionPlan) -> PlanScore:
        s = ev.score(plan)
        visited[plan.key()] = s
        return s

    current = PrecisionPlan.preset(START)
    cur = score(current)
    steps = [Step("start", None, current, cur)]
    start_bytes = cur.bytes
    if not budget.holds(cur):
        # The ceiling (every searchable class in BF16) as a reference point: if even it fails, the
        # budget is probably unreachable by precision alone (a bug?). Not a stopping rule: KL is not
        # monotone in promotions (FP4 errors can cancel), so a subset may still meet the budget.
        ceiling = current.replace(**{c: "bf16" for c in classes})
        steps.append(Step("ceiling", None, ceiling, score(ceiling)))
    promoted: list[str] = []
    # Phase 1: greedy promotion.
    ranking: list[tuple[str, PlanScore]] = []
    if strategy == "ranked":
        # Quark AMP: the rescue table (each class promoted alone) fixes the order once.
        prefetch([current.replace(**{c: "bf16"}) for c in classes])
        ranking = sorted(((c, score(current.replace(**{c: "bf16"}))) for c in classes),
                         key=lambda t: (t[1].kl, t[1].bytes, FLIP_CLASSES.index(t[0])))
    while not budget.holds(cur):
        remaining = [c for c in classes if current[c] != "bf16"]
        if not remaining:
            break
        if strategy == "ranked":
            c = next(c for c, _ in ranking if c in remaining)
            cands: list[tuple[str, PlanScore]] = ranking if not promoted else []
            best = (c, score(current.replace(**{c: "bf16"})))
        else:
            prefetch([current.replace(**{c: "bf16"}) for c in remaining])   # a step's candidates
            cands = [(c, score(current.replace(**{c: "bf16"}))) for c in remaining]
            best = cands[0]
            for cand in cands[1:]:
                if _better(cand, best):
                    best = cand
        current, cur = best[1].plan, best[1]
        promoted.append(best[0])
        steps.append(Step("promote", best[0], current, cur, tuple(cands)))
    met = budget.holds(cur)
    # Phase 2: revert promotions the budget does not need (only meaningful once it holds).
    while met:
        prefetch([current.replace(**{c: "fp4"}) for c in promoted])
        cands = [(c, score(current.replace(**{c: "fp4"}))) for c in promoted]
        ok = [(c, s) for c, s in cands if budget.holds(s)]
        if not ok:
            break
        c, s = min(ok, key=lambda t: (t[1].bytes, t[1].kl, FLIP_CLASSES.index(t[0])))
        current, cur = s.plan, s
        promoted.remove(c)
        steps.append(Step("revert", c, current, cur, tuple(cands)))
    return SearchResult(budget, current, cur, met, steps, visited, start_bytes, strategy)


def column_run(ev: Evaluator, plan: PrecisionPlan) -> Evaluation:
    """``plan`` in the logic, floor and bug-budget columns (the bug budget only where a kernel backend
    executes; its absence and the reason are in the manifest)."""
    from .evaluate import COLUMNS

    return ev.evaluate(plan, columns=COLUMNS, backend="auto")


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import add_common, open_session, run_tool

    p = argparse.ArgumentParser(prog="python -m precision_floor.search", description=__doc__.split("\n\n")[0])
    add_common(p)
    p.add_argument("--budget-kl", type=float, default=DEFAULT_BUDGET_KL,
                   help=f"first-token KL(reference || native) budget in nats (default {DEFAULT_BUDGET_KL}, "
                        f"sensible for tiny)")
    p.add_argument("--budget-top1", type=float, default=DEFAULT_BUDGET_TOP1,
                   help=f"minimum first-token top-1 agreement (default {DEFAULT_BUDGET_TOP1})")
    p.add_argument("--classes", default=None, help="comma-separated classes the search may promote (default: all)")
    p.add_argument("--strategy", choices=STRATEGIES, default="steepest",
                   help="steepest: re-score every class each step; ranked: rescue-table order")
    args = p.parse_args(argv)
    from .render import search_tables

    def body(console) -> int:
        from dsv4.plan import PrecisionPlan
        from .constants import FLIP_CLASSES
        from .flips import check_classes

        budget = Budget(args.budget_kl, args.budget_top1)
        session = open_session(args, console)
        classes = check_classes(args.classes.split(",")) if args.classes else None
        result = floor_search(session.evaluator, budget, classes, args.strategy)
        # The report's per-layer curves and top-k tables: the floor plan in every column; and the
        # presets as reference points of the Pareto plot.
        column_run(session.evaluator, result.floor)
        session.evaluator.prefetch([PrecisionPlan.preset(n) for n in REFERENCE_PLANS])
        for name in REFERENCE_PLANS:
            session.evaluator.score(PrecisionPlan.preset(name))
        session.store.write_json("search", {**session.header(), "classes": list(classes or FLIP_CLASSES),
                                            **result.to_json()})
        for t in search_tables(result):
            console.print(t)
        session.finish(console)
        return 0 if result.met else 1

    return run_tool(body, args)


if __name__ == "__main__":
    sys.exit(main())
