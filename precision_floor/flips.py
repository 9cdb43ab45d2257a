"""Flip tables in both directions (docs/methods.md §7.1), one row per component class:

* **rescue**: ``all-fp4`` except class c in BF16 — how much of the NVFP4 error c alone accounts for;
* **damage**: ``all-bf16`` except class c in FP4 — how much error c alone introduces.

``kv_cache`` stays as its preset has it (FP8 in ``all-fp4``, BF16 in ``all-bf16``): it holds
activations, and FP4 is not a legal format for it. Each row carries the plan's score (first-token
KL +- SE, top-1 agreement +- SE, all-position KL, worst per-layer cosine, router Jaccard, indexer
overlap) and **dKL**, the change against the direction's base plan with a *paired* standard error
over prompts (both plans see the same prompts, so the prompt-to-prompt spread cancels).

``python -m precision_floor.flips [--checkpoint] [--records DIR] [--resume]``
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from dsv4.plan import PrecisionPlan
    from .evaluate import PlanScore, Scorer




DIRECTIONS = {"rescue": ("all-fp4", "bf16"), "damage": ("all-bf16", "fp4")}
# |dKL| beyond this many paired SEs is marked significant in the tables.
SIGNIFICANT_SE = 2.0


def flip_plan(direction: str, cls: str) -> PrecisionPlan:
    from dsv4.plan import PrecisionPlan
    from .errors import FloorInputError
    from .constants import FLIP_CLASSES

    if direction not in DIRECTIONS:
        raise FloorInputError(f"flip direction: expected one of {list(DIRECTIONS)}, found {direction!r}")
    if cls not in FLIP_CLASSES:
        raise FloorInputError(f"flip class: expected one of {list(FLIP_CLASSES)}, found {cls!r}")
    base, fmt = DIRECTIONS[direction]
    return PrecisionPlan.preset(base).replace(**{cls: fmt})


def check_classes(classes: Iterable[str] | None) -> tuple[str, ...]:
    from .errors import FloorInputError
    from .constants import FLIP_CLASSES

    if classes is None:
        return FLIP_CLASSES
    out = tuple(classes)
    bad = [c for c in out if c not in FLIP_CLASSES]
    if bad or not out:
        raise FloorInputError(f"classes: expected a non-empty subset of {list(FLIP_CLASSES)}, found {list(out)}")
    return out


def per_prompt_kl(records: pd.DataFrame) -> pd.Series:
    """First-token KL per prompt (the per-prompt ``kl`` record at the last prompt position)."""
    from parity.records import ALL_PROMPTS
    from .evaluate import SCORE_MODE, SCORE_PAIR

    d = records[(records["pair"] == SCORE_PAIR) & (records["compare_mode"] == SCORE_MODE)
                & (records["probe"] == "logits") & (records["metric"] == "kl") & (records["prompt_id"] != ALL_PROMPTS)]
    return d.set_index("prompt_id")["value"]


def paired_delta(test: pd.Series, base: pd.Series) -> tuple[float, float]:
    """(mean, SE) of test - base over the prompts both have."""
    common = test.index.intersection(base.index)
    diff = (test[common] - base[common]).astype(float)
    n = len(diff)
    if n == 0:
        return math.nan, math.nan
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan


@dataclass
class FlipTables:
    rescue: pd.DataFrame
    damage: pd.DataFrame
    baselines: dict[str, PlanScore]

    def frame(self, direction: str) -> pd.DataFrame:
        return {"rescue": self.rescue, "damage": self.damage}[direction]

    def to_json(self) -> dict:
        return {"baselines": {n: s.row() for n, s in self.baselines.items()},
                "rescue": _records(self.rescue), "damage": _records(self.damage)}


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict(orient="records")]


def _row(direction: str, cls: str, s: PlanScore, base: PlanScore, d_kl: tuple[float, float],
         class_bytes: int) -> dict:
    delta, se = d_kl
    # rescue: a class matters when promoting it LOWERS KL; damage: when demoting it RAISES KL.
    effect = -delta if direction == "rescue" else delta
    return {"direction": direction, "class": cls, **s.row(), "d_kl": delta, "d_kl_se": se, "effect": effect,
            "significant": significant(delta, se), "class_bytes_delta": class_bytes, "base": base.plan.name}


def significant(delta: float, se: float) -> bool:
    """|delta| beyond SIGNIFICANT_SE paired standard errors (an SE of exactly 0 with a non-zero delta:
    every prompt moved by the same amount, which is significant too)."""
    if math.isnan(delta) or math.isnan(se):
        return False
    return abs(delta) > SIGNIFICANT_SE * se if se > 0 else delta != 0


def run_flips(ev: Scorer, classes: Sequence[str] | None = None,
              directions: Sequence[str] = tuple(DIRECTIONS)) -> FlipTables:
    """Evaluate (or load) every flip plan and both baselines; tables sorted by effect, largest first."""
    import pandas as pd
    from dsv4.plan import PrecisionPlan

    classes = check_classes(classes)
    # every plan of the tables, known ahead: spread over the ranks under torchrun (no-op in one process)
    getattr(ev, "prefetch", lambda plans: None)([PrecisionPlan.preset(DIRECTIONS[d][0]) for d in DIRECTIONS if d in directions]
                + [flip_plan(d, c) for d in DIRECTIONS if d in directions for c in classes])
    baselines: dict[str, PlanScore] = {}
    frames: dict[str, pd.DataFrame] = {}
    for direction in ("rescue", "damage"):
        base_name = DIRECTIONS[direction][0]
        if direction not in directions:
            frames[direction] = pd.DataFrame()
            continue
        base = baselines[base_name] = ev.score(PrecisionPlan.preset(base_name))
        base_kl = per_prompt_kl(ev.evaluate(base.plan).records)
        rows = []
        for cls in classes:
            s = ev.score(flip_plan(direction, cls))
            d = paired_delta(per_prompt_kl(ev.evaluate(s.plan).records), base_kl)
            rows.append(_row(direction, cls, s, base, d, s.bytes - base.bytes))
        frames[direction] = pd.DataFrame(rows).sort_values("effect", ascending=False, kind="stable") \
            .reset_index(drop=True)
    return FlipTables(frames["rescue"], frames["damage"], baselines)


def main(argv: Sequence[str] | None = None) -> int:
    from .constants import FLIP_CLASSES

    from .cli import add_common, open_session, run_tool

    p = argparse.ArgumentParser(prog="python -m precision_floor.flips", description=__doc__.split("\n\n")[0])
    add_common(p)
    p.add_argument("--classes", default=None, help="comma-separated subset of the component classes "
                                                   f"(default: all ten: {','.join(FLIP_CLASSES)})")
    p.add_argument("--direction", choices=("both", *DIRECTIONS), default="both")
    args = p.parse_args(argv)
    from .render import flip_table

    def body(console) -> int:
        session = open_session(args, console)
        classes = check_classes(args.classes.split(",")) if args.classes else None
        dirs = tuple(DIRECTIONS) if args.direction == "both" else (args.direction,)
        tables = run_flips(session.evaluator, classes, dirs)
        session.store.write_json("flips", {**session.header(), "classes": list(classes or FLIP_CLASSES),
                                           "directions": list(dirs), **tables.to_json()})
        for d in dirs:
            console.print(flip_table(tables.frame(d), d, tables.baselines[DIRECTIONS[d][0]]))
        session.finish(console)
        return 0

    return run_tool(body, args)


if __name__ == "__main__":
    sys.exit(main())
