"""The HTML report: one self-contained file (inline CSS and SVG, no script, no URL) rendered from an
evaluation store and, optionally, the bug zoo's summary and records.

Sections: summary, provenance, flip tables (rescue, damage), floor and Pareto curve, per-layer cosine
curves of the logic / floor / bug-budget columns, first-token top-k, selection agreement, bug zoo,
attribution study, timings.
"""
from __future__ import annotations

import math
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd

from dsv4.plan import PrecisionPlan
from parity.records import ALL_PROMPTS
from parity.rules import load_rules
from parity.verdict import evaluate as judge_verdict

from ..cache import EvalStore
from ..evaluate import FLIP_CLASSES
from ..flips import DIRECTIONS
from . import sections_extra as extra
from .data import ReportData, load_report_data
from .html import Col, bar, esc, kib, kv_table, note, num, pm, section, signed_kib, table
from .svg import Point, Series, lines, scatter

TITLE = "DeepSeek-V4 NVFP4 precision floor"
SECTIONS = (("summary", "Summary"), ("provenance", "Provenance"), ("flips", "Flip tables"),
            ("floor", "Floor and Pareto curve"), ("layers", "Per-layer cosine"), ("topk", "First-token top-k"),
            ("selection", "Selection agreement"), ("bugzoo", "Bug zoo"), ("attribution", "Attribution study"),
            ("timings", "Timings"))
COS_FLOOR = 1e-7   # 1 - cosine below this is drawn at this value (the log axis has no zero)


def css() -> str:
    return resources.files("precision_floor.report").joinpath("style.css").read_text(encoding="utf-8")


def chips(plan: PrecisionPlan, classes: tuple[str, ...] = FLIP_CLASSES + ("kv_cache",)) -> str:
    return "".join(f'<span class="plan-chip fmt-{esc(plan[c])}" title="{esc(c)} = {esc(plan[c])}">'
                   f"{esc(c)}={esc(plan[c])}</span>" for c in classes)


def set_list(classes: list[str]) -> str:
    return ", ".join(f"<code>{esc(c)}</code>" for c in classes) or "—"


# ---- summary -------------------------------------------------------------------------------------
def summary_section(d: ReportData) -> str:
    cards: list[tuple[str, str]] = []
    s = d.search
    if s is not None:
        cards += [("floor: BF16 classes", set_list(s.floor_set) if s.met else "budget not met"),
                  ("first-token KL", pm(s.score.kl, s.score.kl_se)),
                  ("top-1 agreement", pm(s.score.top1, s.score.top1_se, 3)),
                  ("weight bytes vs all-fp4", f"{kib(s.score.bytes)} (×{s.score.bytes / s.start_bytes:.3f})"),
                  ("budget", esc(s.budget.describe()))]
    ck = d.provenance.get("checkpoint", {})
    cards.append(("checkpoint", f"{esc(ck.get('spec'))} <code>{esc(str(ck.get('fingerprint', ''))[:12])}</code>"))
    if d.columns is not None:
        v = judge_verdict(d.columns.records, load_rules(None, ck.get("spec")))
        logic_ok = v.pair_passed("logic")
        cards.append(("logic column (rules)", '<span class="yes">passes</span>' if logic_ok
                      else '<span class="no">fails</span>'))
    if d.zoo_summary:
        cards.append(("bug zoo", '<span class="yes">passed</span>' if d.zoo_summary.get("passed")
                      else '<span class="no">failed</span>'))
    if d.attribution and d.attribution.get("faults"):
        mis = sum(r["verdict"] == "misattributed" for r in d.attribution["faults"])
        cards.append(("attribution: misattributed faults", f"{mis} of {len(d.attribution['faults'])}"))
    body = '<div class="summary">' + "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{v}</div></div>' for k, v in cards) + "</div>"
    for w in d.warnings:
        body += note(esc(w), "warn")
    intro = ("KL is KL(reference ‖ native) in nats over the full vocabulary at the first generated position, "
             "mean over the prompt set ± its standard error. The floor is a floor only while the logic column "
             "(reference in FP32 ↔ native all-fp32) passes: with a layer bug the floor column measures the bug too.")
    return section("summary", "Summary", body, intro)


# ---- provenance ----------------------------------------------------------------------------------
def provenance_section(d: ReportData) -> str:
    p = d.provenance
    ck, cfg = p.get("checkpoint", {}), p.get("config", {})
    ctx = d.context
    items = [
        ("checkpoint", f"{esc(ck.get('spec'))} ({esc(ck.get('flavor'))}, "
                       + (f"seed {esc(ck.get('seed'))})" if ck.get("seed") is not None else "trained weights, no seed)")),
        ("checkpoint path", f"<code>{esc(ck.get('path'))}</code>"),
        ("fingerprint", f"<code>{esc(ck.get('fingerprint'))}</code>"),
        ("config", esc(cfg.get("name")) + " — " + esc(", ".join(
            f"{k}={cfg[k]}" for k in ("num_hidden_layers", "hidden_size", "vocab_size", "n_routed_experts",
                                      "num_experts_per_tok", "compress_ratios", "num_hash_layers") if k in cfg))),
        ("git SHA", f"<code>{esc(p.get('git_sha'))}</code> (code version <code>{esc(p.get('code_version'))}</code>)"),
        ("device", esc(p.get("device"))),
        ("library versions", esc(", ".join(f"{k} {v}" for k, v in p.get("versions", {}).items()))),
        ("reference profile", esc(ctx.profile if ctx else "")),
        ("compare modes", esc(", ".join(ctx.modes) if ctx else "")),
        ("prompts", esc(f"{len(p.get('prompts', []))} of the standard set: ") + ", ".join(
            f"<code>{esc(q['id'])}</code> ({q['tokens']} tok)" for q in p.get("prompts", []))),
        ("store", f"<code>{esc(d.store.root)}</code>, {len(d.timings)} evaluations"),
        ("generated", esc(time.strftime("%Y-%m-%d %H:%M:%S %z"))),
    ]
    backends = table(p.get("backends", []), [
        Col("backend", "name", align="left"),
        Col("executes here", "executes_here", lambda v, r: '<span class="yes">yes</span>' if v
            else '<span class="no">no — compiled, not executed</span>' if "compiled" in (r.get("note") or "")
            else '<span class="no">no</span>', "left"),
        Col("note", "note", align="left"), Col("priority", "priority")],
        caption="Kernel backends registered in this environment; the bug-budget column needs one that executes.")
    plans = ""
    if d.search is not None:
        plans += f"<h3>Floor plan <code>{esc(d.search.floor.name)}</code></h3><p>{chips(d.search.floor)}</p>"
    for name in ("default", "all-fp4", "all-bf16"):
        plans += f"<h3>Preset <code>{name}</code></h3><p>{chips(PrecisionPlan.preset(name))}</p>"
    return section("provenance", "Provenance", kv_table(items) + "<h3>Backends</h3>" + backends + plans)


# ---- flip tables ---------------------------------------------------------------------------------
def _flip_html(df: pd.DataFrame, direction: str) -> str:
    if df.empty:
        return note(f"{direction} table not run.")
    scale = max((abs(v) for v in df["d_kl"] if isinstance(v, float) and math.isfinite(v)), default=0.0) or 1.0
    cols = [Col("class", "class", lambda v, r: f"<code>{esc(v)}</code>", "left"),
            Col("bytes vs base", "class_bytes_delta", lambda v, r: signed_kib(v)),
            Col("first-token KL", "kl", lambda v, r: pm(v, r["kl_se"])),
            Col("ΔKL vs base", "d_kl", lambda v, r: pm(v, r["d_kl_se"]) + (" *" if r["significant"] else ""),
                title="paired over prompts; * = beyond 2 SE"),
            Col("", "d_kl", lambda v, r: bar(v, r["d_kl_se"], scale), "left"),
            Col("top-1", "top1", lambda v, r: pm(v, r["top1_se"], 3)),
            Col("KL all positions", "kl_all", lambda v, r: pm(v, r["kl_all_se"])),
            Col("worst layer cos", "worst_cos", lambda v, r: num(v, 5) + (
                f" (L{int(r['worst_cos_layer'])})" if r.get("worst_cos_layer") is not None
                and not (isinstance(r["worst_cos_layer"], float) and math.isnan(r["worst_cos_layer"])) else "")),
            Col("router Jaccard", "router_jaccard", lambda v, r: num(v, 3)),
            Col("indexer overlap", "indexer_overlap", lambda v, r: num(v, 3))]
    return table(df.to_dict(orient="records"), cols, row_cls=lambda r: "sig" if r["significant"] else "",
                 caption="Sorted by effect (rescue: KL removed by promoting c; damage: KL added by demoting c). "
                         "Bold / * : |ΔKL| beyond 2 paired standard errors over prompts. Bars: ΔKL with ±1 SE.")


def flips_section(d: ReportData) -> str:
    if d.flips is None:
        return section("flips", "Flip tables", note("No flip tables in this store: run "
                                                    "<code>python -m precision_floor.flips --records DIR</code>."))
    body = ""
    for direction, (base, fmt) in DIRECTIONS.items():
        b = d.flips.baselines.get(base)
        what = "everything FP4 except c in BF16" if direction == "rescue" else "everything BF16 except c in FP4"
        head = f"<h3>{direction.capitalize()}: {what}</h3>"
        if b is not None:
            head += (f"<p>Base <code>{base}</code>: first-token KL {pm(b.kl, b.kl_se)}, "
                     f"top-1 {pm(b.top1, b.top1_se, 3)}, {kib(b.bytes)}.</p>")
        body += head + _flip_html(d.flips.frame(direction), direction)
    intro = ("Each row changes one component class. <code>kv_cache</code> keeps its preset format (FP8 in all-fp4, "
             "BF16 in all-bf16): it holds activations, and FP4 is not a legal format for it. Metrics: floor column "
             "(reference ↔ native plan, emulated backend), propagated mode; worst layer cosine = min over prompts "
             "and layers of <code>layers.i.out</code>; router Jaccard over score-routed layers; indexer top-k overlap "
             "over CSA layers.")
    return section("flips", "Flip tables", body, intro)


# ---- floor and Pareto ----------------------------------------------------------------------------
def floor_section(d: ReportData) -> str:
    s = d.search
    if s is None:
        return section("floor", "Floor and Pareto curve", note("No floor search in this store: run "
                                                               "<code>python -m precision_floor.search</code>."))
    sc = s.score
    items = [("budget", esc(s.budget.describe())), ("strategy", esc(s.strategy)),
             ("met", '<span class="yes">yes</span>' if s.met else '<span class="no">no</span>'),
             ("floor (BF16 set)", set_list(s.floor_set)), ("plan", f"<code>{esc(s.floor.name)}</code>"),
             ("first-token KL", pm(sc.kl, sc.kl_se)), ("top-1 agreement", pm(sc.top1, sc.top1_se, 3)),
             ("KL all positions", pm(sc.kl_all, sc.kl_all_se)),
             ("weight bytes", f"{kib(sc.bytes)}: {signed_kib(sc.bytes - s.start_bytes)} vs all-fp4 "
                              f"(×{sc.bytes / s.start_bytes:.3f})"),
             ("plans visited", str(len(s.visited)))]
    steps = table(s.steps_frame().to_dict(orient="records"), [
        Col("phase", "phase", align="left"),
        Col("class", "class", lambda v, r: f"<code>{esc(v)}</code>" if isinstance(v, str) else "", "left"),
        Col("plan", "label", align="left"), Col("first-token KL", "kl", lambda v, r: pm(v, r["kl_se"])),
        Col("top-1", "top1", lambda v, r: pm(v, r["top1_se"], 3)),
        Col("bytes vs all-fp4", "bytes", lambda v, r: signed_kib(v - s.start_bytes)),
        Col("budget", "holds", lambda v, r: '<span class="yes">holds</span>' if v
            else '<span class="no">fails</span>')],
        caption="Each promote step keeps the candidate with the lowest KL; revert steps drop a promotion the budget "
                "does not need (add-then-revert).")
    v = s.visited_frame()
    pts = []
    for r in v.to_dict(orient="records"):
        cls = "floor" if r["floor"] else "front" if r["pareto"] else "pt"
        pts.append(Point(r["bytes"] / 1024, r["kl"], r["kl_se"] or 0.0, "floor" if r["floor"] else "", cls,
                         f"{r['label']}: KL {r['kl']:.4g} ± {r['kl_se'] or 0:.2g}, {r['bytes'] / 1024:,.1f} KiB"))
    front = [p for p in pts if p.cls in ("front", "floor")]
    for name, ps in d.presets.items():
        if ps.plan.key() not in set(v["plan_key"]):
            pts.append(Point(ps.bytes / 1024, ps.kl, ps.kl_se, name, "ref",
                             f"preset {name}: KL {ps.kl:.4g}, {ps.bytes / 1024:,.1f} KiB"))
    plot = scatter(pts, x_label="weight bytes (KiB)", y_label="first-token KL (nats, log)",
                   title="Pareto curve: KL vs weight bytes of every visited plan", front=front, budget_y=s.budget.kl)
    front_tbl = table(v[v["pareto"]].to_dict(orient="records"), [
        Col("plan", "label", align="left"), Col("bytes", "bytes", lambda x, r: kib(x)),
        Col("vs all-fp4", "extra_bytes", lambda x, r: signed_kib(x)),
        Col("first-token KL", "kl", lambda x, r: pm(x, r["kl_se"])),
        Col("top-1", "top1", lambda x, r: pm(x, r["top1_se"], 3))],
        row_cls=lambda r: "floor" if r["floor"] else "",
        caption="The Pareto front of the visited plans (green: the floor).")
    intro = ("Greedy promotion from all-fp4, then add-then-revert. Points: every plan the search visited (blue: "
             "Pareto front, green: the floor, hollow: presets for reference), with ±1 SE bars; dashed red: the KL "
             "budget. With few prompts the SEs are wide: promotions whose KL differences sit inside them are "
             "choices among statistically equal candidates.")
    return section("floor", "Floor and Pareto curve",
                   kv_table(items) + '<div class="grid-2"><div>' + plot + "</div></div>" + "<h3>Search path</h3>"
                   + steps + "<h3>Pareto front</h3>" + front_tbl, intro)


# ---- per-layer cosine ----------------------------------------------------------------------------
def layers_section(d: ReportData) -> str:
    if d.columns is None:
        return section("layers", "Per-layer cosine", note("No column run of the floor plan in this store."))
    from parity.verdict import probe_order_key

    m, df = d.columns.manifest, d.columns.records
    cos = df[(df["metric"] == "cosine") & (df["compare_mode"] == "propagated") & (df["prompt_id"] != ALL_PROMPTS)]
    probes = sorted(set(cos["probe"]), key=probe_order_key)
    xs = list(range(len(probes)))
    series, absent = [], []
    for pair in ("logic", "floor", "bug_budget"):
        col = m["columns"].get(pair, {})
        if not col.get("ran"):
            absent.append(f"<b>{pair}</b>: absent — {esc(col.get('reason') or 'not run')}")
            continue
        worst = cos[cos["pair"] == pair].groupby("probe")["value"].min()
        ys = [max(1.0 - float(worst[p]), COS_FLOOR) if p in worst.index else None for p in probes]
        series.append(Series(pair, ys))
    marks = []
    for i, p in enumerate(probes):
        layer = p.split(".")[1] if p.startswith("layers.") else None
        prev = probes[i - 1].split(".")[1] if i and probes[i - 1].startswith("layers.") else None
        if layer is not None and layer != prev:
            marks.append((i, f"L{layer}"))
        elif layer is None and prev is not None:
            marks.append((i, "head"))
    plot = lines(xs, series, x_label="probe (execution order; dotted lines: layer starts)",
                 y_label="1 − cosine (worst prompt, log)", title="Per-probe cosine distance of the three columns",
                 x_marks=marks)
    outs = [p for p in probes if p.endswith(".out") and p.count(".") == 2] + (["logits"] if "logits" in probes else [])
    rows = []
    for p in outs:
        r: dict[str, Any] = {"probe": p}
        for pair in ("logic", "floor", "bug_budget"):
            g = cos[(cos["pair"] == pair) & (cos["probe"] == p)]["value"]
            r[pair] = float(g.min()) if not g.empty else None
        rows.append(r)
    tbl = table(rows, [Col("probe", "probe", lambda v, r: f"<code>{esc(v)}</code>", "left")] +
                [Col(f"{pair} cos (worst)", pair, lambda v, r: num(v, 6)) for pair in ("logic", "floor", "bug_budget")])
    bug = "".join(note(a) for a in absent)
    intro = (f"Propagated cosine per probe of the floor plan <code>{esc(m.get('plan_name'))}</code>, worst over "
             "prompts, in three columns: logic = reference in FP32 ↔ native all-fp32 on the emulated backend (a gap "
             "above FP32 noise is a layer bug); floor = reference ↔ native plan on the emulated backend (what "
             "NVFP4 costs); bug budget = emulated ↔ kernel backend (judged call by call by the kernel audit). 1 − cosine below "
             f"{COS_FLOOR:g} is drawn at {COS_FLOOR:g}.")
    return section("layers", "Per-layer cosine", bug + plot + tbl, intro)


def render_report(store: EvalStore, *, zoo_summary: Path | None = None, zoo_records: Path | None = None,
                  title: str = TITLE) -> str:
    d = load_report_data(store, zoo_summary, zoo_records)
    parts = [summary_section(d), provenance_section(d), flips_section(d), floor_section(d), layers_section(d),
             extra.topk_section(d), extra.selection_section(d), extra.bugzoo_section(d),
             extra.attribution_section(d), extra.timings_section(d)]
    nav = "".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in SECTIONS)
    ck = d.provenance.get("checkpoint", {})
    sub = f"{esc(ck.get('spec'))} · {esc(d.provenance.get('config', {}).get('name'))} · " \
          f"{esc(d.provenance.get('device'))} · code {esc(d.provenance.get('code_version'))}"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
            f"<style>{css()}</style></head><body><header><h1>{esc(title)}</h1><div class=\"sub\">{sub}</div></header>"
            f"<nav>{nav}</nav><main>{''.join(parts)}</main><footer>Rendered by <code>python -m "
            "precision_floor.report</code> from the evaluation store's records; self-contained (inline CSS and SVG, "
            "no script, no external resource).</footer></body></html>\n")


__all__ = ["SECTIONS", "render_report"]
