"""Rich tables for the precision-floor CLIs (the library never prints; the CLIs print these)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import pandas as pd
from rich.table import Table

from parity.numbers import pm, sig

from .evaluate import PlanScore, plan_label

if TYPE_CHECKING:  # render only reads what flips/search hand it: no import back (one-way room)
    from .search import SearchResult


def kib(n: Any) -> str:
    return "—" if n is None else f"{int(n) / 1024:,.1f} KiB"


def flip_table(df: pd.DataFrame, direction: str, base: PlanScore) -> Table:
    what = "all-fp4 except c in BF16" if direction == "rescue" else "all-bf16 except c in FP4"
    t = Table(title=f"{direction} table: {what} (base {base.plan.name}: first-token KL {pm(base.kl, base.kl_se)}, "
                    f"top-1 {pm(base.top1, base.top1_se, 3)})", title_justify="left")
    for c in ("class", "first-token KL", "dKL vs base (paired SE)", "top-1", "KL all positions",
              "worst layer cos", "router Jaccard", "indexer overlap", "bytes vs base"):
        t.add_column(c, justify="left" if c == "class" else "right")
    for r in df.to_dict(orient="records"):
        layer = "" if r["worst_cos_layer"] is None or (isinstance(r["worst_cos_layer"], float)
                                                       and math.isnan(r["worst_cos_layer"])) \
            else f" (L{int(r['worst_cos_layer'])})"
        d = pm(r["d_kl"], r["d_kl_se"]) + (" *" if r["significant"] else "")
        t.add_row(r["class"], pm(r["kl"], r["kl_se"]), d, pm(r["top1"], r["top1_se"], 3),
                  pm(r["kl_all"], r["kl_all_se"]), sig(r["worst_cos"], 5) + layer, sig(r["router_jaccard"], 3),
                  sig(r["indexer_overlap"], 3), f"{r['class_bytes_delta'] / 1024:+,.1f} KiB",
                  style="bold" if r["significant"] else "")
    t.caption = "sorted by effect; * = |dKL| > 2 paired SE over prompts"
    return t


def search_tables(result: SearchResult) -> list[Table]:
    steps = Table(title=f"floor search, budget: {result.budget.describe()}", title_justify="left")
    for c in ("step", "phase", "class", "plan", "first-token KL", "top-1", "bytes vs all-fp4", "budget"):
        steps.add_column(c, justify="left" if c in ("phase", "class", "plan") else "right")
    for n, st in enumerate(result.steps):
        s = st.score
        steps.add_row(str(n), st.phase, st.cls or "", plan_label(st.plan), pm(s.kl, s.kl_se), pm(s.top1, s.top1_se, 3),
                      f"{(s.bytes - result.start_bytes) / 1024:+,.1f} KiB",
                      "holds" if result.budget.holds(s) else "fails")
    floor = Table(title="floor" + ("" if result.met else " (budget NOT met: every class promoted)"),
                  title_justify="left", show_header=False)
    s = result.score
    floor.add_row("BF16 set", ", ".join(result.floor_set) or "(none: all-fp4 meets the budget)")
    floor.add_row("plan", result.floor.name)
    floor.add_row("first-token KL", pm(s.kl, s.kl_se))
    floor.add_row("top-1 agreement", pm(s.top1, s.top1_se, 3))
    floor.add_row("weight bytes", f"{kib(s.bytes)} ({(s.bytes - result.start_bytes) / 1024:+,.1f} KiB, "
                                  f"x{s.bytes / result.start_bytes:.3f} vs all-fp4)")
    floor.add_row("plans visited", str(len(result.visited)))
    front = Table(title="Pareto front (KL vs bytes) of the visited plans", title_justify="left")
    for c in ("plan", "bytes", "first-token KL"):
        front.add_column(c, justify="left" if c == "plan" else "right")
    v = result.visited_frame()
    for r in v[v["pareto"]].to_dict(orient="records"):
        front.add_row(r["label"], kib(r["bytes"]), pm(r["kl"], r["kl_se"]), style="bold" if r["floor"] else "")
    return [steps, floor, front]


def attribution_table(df: pd.DataFrame) -> Table:
    t = Table(title="attribution study: would the flip tables / floor search blame a precision choice?",
              title_justify="left")
    for c in ("fault", "expected column", "logic flags", "excess KL all-fp4", "rescue 'fixes'", "damage shows",
              "search floor (fault)", "search extra", "verdict"):
        t.add_column(c)
    for r in df.to_dict(orient="records"):
        t.add_row(r["fault"], r["column"], "yes" if r["logic_flags"] else "no", pm(r["excess_kl"], r["excess_kl_se"]),
                  ", ".join(r["rescue_fixes"]) or "—", ", ".join(r["damage_shows"]) or "—",
                  ", ".join(r["search_floor"]) if r["search_met"] else "budget not met",
                  ", ".join(r["search_blames"]) or "—", r["verdict"],
                  style="red" if r["verdict"] == "misattributed" else "")
    return t
