"""Report sections past the floor: first-token top-k, selection agreement, bug zoo, attribution study,
timings (build.py holds the first half; split to keep files small)."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from parity.rules import judge, load_rules
from parity.summary import selection_summary

from .data import ZOO_RECORDS, ZOO_SUMMARY, ReportData
from .html import Col, esc, note, num, pm, section, table

YES, NO = '<span class="yes">yes</span>', '<span class="no">no</span>'


def yn(v: Any, *, good: bool = True) -> str:
    """yes/no, coloured by whether the value is the good outcome."""
    if v is None:
        return "—"
    return (YES if v else NO) if good else ('<span class="no">yes</span>' if v else '<span class="yes">no</span>')


def codes(xs: Any) -> str:
    return ", ".join(f"<code>{esc(x)}</code>" for x in (xs or [])) or "—"


# ---- first-token top-k ---------------------------------------------------------------------------
def topk_section(d: ReportData) -> str:
    if d.columns is None or not d.columns.manifest.get("topk", {}).get("floor"):
        return section("topk", "First-token top-k", note("No first-token top-k table in this store."))
    m = d.columns.manifest
    col = m["columns"]["floor"]
    rows = m["topk"]["floor"]
    first = {}
    for r in rows:
        first.setdefault(r["prompt_id"], r)
    tbl = table(rows, [
        Col("prompt", "prompt_id", lambda v, r: f"<code>{esc(v)}</code>" if first[v] is r else "", "left"),
        Col("rank", "rank"), Col("token id", "token_id"),
        Col("token", "token", lambda v, r: f"<code>{esc(v)}</code>", "left"),
        Col("reference p", "ref_prob", lambda v, r: num(v, 4)),
        Col("native p", "test_prob", lambda v, r: num(v, 4)),
        Col("native rank", "test_rank")],
        row_cls=lambda r: "fail" if r["test_rank"] != r["rank"] else "",
        caption="Red rows: the native model ranks the token differently.")
    intro = (f"The reference's top-{max(r['rank'] for r in rows)} first tokens per prompt "
             f"({esc(col.get('anchor'))}) with the probabilities of {esc(col.get('test'))}. In thinking mode the "
             "prompt already ends with the think token, so its low first-position logit is expected.")
    return section("topk", "First-token top-k", tbl, intro)


# ---- selection agreement -------------------------------------------------------------------------
SEL_COLS = (("router_jaccard_min", "router Jaccard (min)", 3), ("router_flip_rate", "router flip rate", 3),
            ("router_clear_flip_rate", "router clear flips", 3), ("hash_route_exact", "hash routing exact", 0),
            ("indexer_topk_overlap_mean", "indexer overlap", 3), ("indexer_clear_flip_rate", "indexer clear flips", 3),
            ("entry_count_match", "entry counts match", 0))


def selection_section(d: ReportData) -> str:
    if d.columns is None:
        return section("selection", "Selection agreement", note("No column run in this store."))
    sel = selection_summary(d.columns.records)
    if sel.empty:
        return section("selection", "Selection agreement", note("No selection records."))
    present = [c for c in SEL_COLS if c[0] in sel.columns]
    rows = sel.to_dict(orient="records")
    tbl = table(rows, [Col("column", "pair", align="left"), Col("layer", "layer", lambda v, r: str(int(v)))] +
                [Col(h, k, (lambda dg: (lambda v, r: num(v, dg) if dg else
                                        ("—" if v is None or (isinstance(v, float) and math.isnan(v))
                                         else yn(v == 1.0))))(dg)) for k, h, dg in present],
                caption="Worst over prompts, propagated. Clear flips: choices that differ with a margin above the tie "
                        "margin (near-tie flips are forgiven).")
    intro = ("Router: Jaccard of the selected expert sets per token, flip rates (any different expert; clear = beyond "
             "the near-tie margin); hash-routed layers must agree exactly. Indexer: top-k overlap over valid entries. "
             "Compressed-entry counts must match.")
    return section("selection", "Selection agreement", tbl, intro)


# ---- bug zoo -------------------------------------------------------------------------------------
def _div(v: Any) -> str:
    if not v:
        return "—"
    return (f"<code>{esc(v.get('probe'))}</code> ({esc(v.get('component'))}): {esc(v.get('metric'))} = "
            f"{num(v.get('value'), 4)} vs {esc(v.get('op'))} {num(v.get('threshold'), 4)}")


def bugzoo_section(d: ReportData) -> str:
    body = ""
    z = d.zoo_summary
    if z:
        rows = []
        for r in z.get("rows", []):
            e = r.get("expected") or {}
            at = (f"L{e['layer']} " if e.get("layer") is not None else "") + str(e.get("component", ""))
            rows.append({**r, "name": r.get("fault") or "(clean)", "exp_column": e.get("column", "—"), "exp_at": at})
        body += note(f"Zoo {'<span class=yes>passed</span>' if z.get('passed') else '<span class=no>failed</span>'}"
                     f" on {esc(z.get('checkpoint', {}).get('spec'))} (fingerprint "
                     f"<code>{esc(str(z.get('checkpoint', {}).get('fingerprint', ''))[:12])}</code>), plan "
                     f"<code>{esc((z.get('plan') or {}).get('name'))}</code>, {len(z.get('prompts', []))} prompts of "
                     f"<code>{esc(str(z.get('prompt_set', '')).rsplit('/', 1)[-1])}</code>, "
                     f"{esc((z.get('rules') or {}).get('count'))} rules, {num(z.get('wall_seconds'), 1)} s.")
        body += table(rows, [
            Col("fault", "name", lambda v, r: f"<code>{esc(v)}</code>", "left"),
            Col("expected column", "exp_column", align="left"), Col("at", "exp_at", align="left"),
            Col("columns alarmed", "columns_alarmed", lambda v, r: esc(", ".join(v or [])) or "—", "left"),
            Col("caught", "caught", lambda v, r: yn(v) if r.get("fault") else "—"),
            Col("right column", "column_ok", lambda v, r: yn(v)),
            Col("localized", "localized", lambda v, r: yn(v)),
            Col("first divergence", "first_divergence", lambda v, r: _div(v), "left"),
            Col("passed", "passed", lambda v, r: yn(v)), Col("s", "seconds", lambda v, r: num(v, 1))],
            row_cls=lambda r: "" if r.get("passed") else "fail",
            caption="One three-way run per fault (thresholds unchanged); the clean row must raise no alarm.")
    if d.zoo_records is not None:
        body += zoo_records_table(d.zoo_records)
    if not body:
        body = note(f"Absent: no bug-zoo summary or records in the store. Run <code>python -m parity.bugzoo --json "
                    f"DIR/{ZOO_SUMMARY} --records DIR/{ZOO_RECORDS}</code> (DIR = the store), then re-render.")
    return section("bugzoo", "Bug zoo", body, "Known-bad variants of the native model, injected one at a time: "
                   "each must be caught in its column and localized by the first divergence (docs/methods.md "
                   "§9).")


def zoo_records_table(df: pd.DataFrame) -> str:
    """Per fault and column: records and failing judgements under the default thresholds."""
    j = judge(df, load_rules(None, str(df["config_name"].iloc[0]) if len(df) else None))   # the model's own rules
    df = df.assign(fault=df["fault"].fillna("(clean)"))
    j = j.assign(fault=j["fault"].fillna("(clean)"))
    counts = df.groupby(["fault", "pair"]).size().rename("records")
    fails = j[~j["passed"]].groupby(["fault", "pair"]).size().rename("failing")
    t = pd.concat([counts, fails], axis=1).fillna(0).reset_index()
    return "<h3>From the zoo's records (re-judged here)</h3>" + table(
        t.to_dict(orient="records"), [Col("fault", "fault", lambda v, r: f"<code>{esc(v)}</code>", "left"),
                                      Col("column", "pair", align="left"),
                                      Col("records", "records", lambda v, r: str(int(v))),
                                      Col("failing judgements", "failing", lambda v, r: str(int(v)))])


# ---- attribution ---------------------------------------------------------------------------------
def attribution_section(d: ReportData) -> str:
    a = d.attribution
    if not a or not a.get("faults"):
        return section("attribution", "Attribution study", note(
            "Absent: run <code>python -m precision_floor.attribution --records DIR</code> (DIR = the store)."))
    rows = a["faults"]
    counts = pd.Series([r["verdict"] for r in rows]).value_counts()
    summary = ", ".join(f"{esc(k)}: {v}" for k, v in counts.items())
    budget = a.get("budget") or {}
    tbl = table(rows, [
        Col("fault", "fault", lambda v, r: f"<code>{esc(v)}</code>", "left"),
        Col("zoo column", "column", align="left"),
        Col("logic flags", "logic_flags", lambda v, r: yn(v) + (f'<div class="wide"><small>first divergence '
                                                                f"{esc(r['logic_divergence'])}</small></div>"
                                                                if r.get("logic_divergence") else ""), "left"),
        Col("not applicable in", "not_applicable_plans", lambda v, r: f'<span title="{esc(", ".join(v or []))}">'
            f'{len(v or [])} plans</span>' if v else "—", title="plans the fault cannot apply to (they run clean)"),
        Col("excess KL all-fp4", "excess_kl", lambda v, r: pm(v, r.get("excess_kl_se"))),
        Col("excess KL all-bf16", "excess_kl_all_bf16", lambda v, r: pm(v, r.get("excess_kl_all_bf16_se"))),
        Col("rescue 'fixes'", "rescue_fixes", lambda v, r: codes(v), "left"),
        Col("damage shows", "damage_shows", lambda v, r: codes(v), "left"),
        Col("search floor with fault", "search_floor", lambda v, r: codes(v) if r.get("search_met")
            else '<span class="no">budget not met</span>', "left"),
        Col("search's extra promotions", "search_blames", lambda v, r: codes(v) + (
            "" if r.get("moves_metrics") or not v else " <small>(within noise)</small>"), "left"),
        Col("tools would blame", "blamed", lambda v, r: codes(v), "left"),
        Col("verdict", "verdict", align="left")],
        row_cls=lambda r: "mis" if r["verdict"] == "misattributed" else "")
    intro = (
        "Each bug-zoo fault is injected into every native model the tools build; the flip tables, the floor search "
        f"(budget KL ≤ {esc(budget.get('kl'))}, top-1 ≥ {esc(budget.get('top1'))}, strategy "
        f"{esc(a.get('strategy'))}) and the logic column are run with it. Excess KL = first-token KL with the fault "
        "minus without, same plan (paired SE). <i>Rescue fixes c</i>: promoting c to BF16 removes ≥ "
        f"{100 * (1 - a.get('fix_fraction', 0.2)):.0f}% of the all-fp4 excess; <i>damage shows c</i>: demoting c to "
        "FP4 adds significant excess over all-bf16's; <i>search's extra promotions</i>: in the faulty floor, not in "
        f"the clean floor ({codes(a.get('clean_floor'))}) — blame only when the fault's excess in all-fp4 or "
        "all-bf16 is significant, else the greedy path reacting to noise. A table or search that blames a class "
        "while the logic column is silent would report a precision requirement where there is a bug: "
        "<b>misattributed</b>; a fault neither the logic column nor the tables see is left to the bug-budget "
        "column. Kernel faults are "
        "injected by running the plan's FP4 GEMMs on the faulty backend (what a user measuring reference ↔ kernels "
        "would see); the bug-budget column, not the tables, is what catches them.")
    clean = note("Clean logic column: " + (
        "<span class=no>FLAGS</span> — the study's logic verdicts are not meaningful" if a.get("clean_logic_flags")
        else "<span class=yes>quiet</span>"))
    return section("attribution", "Attribution study", clean + f"<p>Verdicts: {summary}.</p>" + tbl, intro)


# ---- timings -------------------------------------------------------------------------------------
def timings_section(d: ReportData) -> str:
    t = d.timings
    if t.empty:
        return section("timings", "Timings", note("No evaluations."))
    # Clean rows have no fault (None, or NaN once pandas holds the column): only strings are faults.
    t = t.assign(kind=[("fault " if isinstance(f, str) and f else "") + c + (" (" + m + ")" if "," in m else "")
                       for f, c, m in zip(t["fault"], t["columns"], t["modes"])])
    g = t.groupby("kind")["seconds"].agg(["count", "sum", "mean", "median", "max"]).reset_index()
    tbl = table(g.to_dict(orient="records"), [
        Col("evaluation kind (columns)", "kind", align="left"), Col("count", "count"),
        Col("total s", "sum", lambda v, r: num(v, 1)), Col("mean s", "mean", lambda v, r: num(v, 2)),
        Col("median s", "median", lambda v, r: num(v, 2)), Col("max s", "max", lambda v, r: num(v, 2))],
        caption=f"{len(t)} evaluations, {t['seconds'].sum():.1f} s of model time when they were computed "
                "(cached evaluations cost nothing on re-render). One evaluation = load the native plan + every "
                "prompt's forward + comparison; the reference outputs are cached across plans.")
    return section("timings", "Timings", tbl)


__all__ = ["attribution_section", "bugzoo_section", "selection_section", "timings_section", "topk_section"]
