"""Everything the report shows, read from an evaluation store (no model runs).

The flip tables and the floor search are *replayed* from the stored records with
:class:`~precision_floor.evaluate.Replay` (the study summaries only say which context, classes,
budget and strategy to replay), so the numbers in the HTML are a function of the records. The bug
zoo's summary (``parity.bugzoo/1`` JSON) and records are optional inputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dsv4.plan import PrecisionPlan
from parity.records import read_records

from ..cache import EvalContext, EvalStore
from ..errors import StoreError
from ..evaluate import COLUMNS, Evaluation, PlanScore, Replay
from ..flips import DIRECTIONS, FlipTables, run_flips
from ..search import REFERENCE_PLANS, Budget, SearchResult, floor_search

from .studies import ZOO_RECORDS, ZOO_SUMMARY


@dataclass
class ReportData:
    store: EvalStore
    provenance: dict[str, Any] = field(default_factory=dict)
    context: EvalContext | None = None
    flips: FlipTables | None = None
    search: SearchResult | None = None
    presets: dict[str, PlanScore] = field(default_factory=dict)
    columns: Evaluation | None = None
    attribution: dict[str, Any] | None = None
    zoo_summary: dict[str, Any] | None = None
    zoo_records: pd.DataFrame | None = None
    timings: pd.DataFrame = field(default_factory=pd.DataFrame)
    warnings: list[str] = field(default_factory=list)


def _replay(store: EvalStore, study: dict[str, Any]) -> Replay:
    return Replay(store, EvalContext.from_dict(study.get("context") or {}))


def load_report_data(store: EvalStore, zoo_summary: Path | None = None, zoo_records: Path | None = None) -> ReportData:
    d = ReportData(store)
    flips_json, search_json = store.read_json("flips"), store.read_json("search")
    d.attribution = store.read_json("attribution")
    first = search_json or flips_json or d.attribution
    if first is None:
        raise StoreError(f"store {store.root}: expected flips.json, search.json or attribution.json (run "
                         f"python -m precision_floor.flips / .search with --records {store.root}), found none")
    d.provenance, d.context = first.get("provenance", {}), EvalContext.from_dict(first.get("context") or {})
    if flips_json:
        try:
            dirs = [x for x in flips_json.get("directions", DIRECTIONS) if x in DIRECTIONS]
            d.flips = run_flips(_replay(store, flips_json), flips_json.get("classes"), dirs)
        except StoreError as e:
            d.warnings.append(f"flip tables not replayable: {e}")
    if search_json:
        rp = _replay(store, search_json)
        try:
            b = search_json["budget"]
            d.search = floor_search(rp, Budget(b["kl"], b["top1"]), search_json.get("classes"),
                                    search_json.get("strategy", "steepest"))
        except StoreError as e:
            d.warnings.append(f"floor search not replayable: {e}")
        for name in REFERENCE_PLANS:
            try:
                d.presets[name] = rp.score(PrecisionPlan.preset(name))
            except StoreError:
                pass   # a reference point only: shown when the search CLI scored it
        if d.search is not None:
            try:
                d.columns = rp.evaluate(d.search.floor, columns=COLUMNS, backend="auto")
            except StoreError as e:
                d.warnings.append(f"no logic / floor / bug-budget run of the floor plan: {e}")
    d.timings = timings(store)
    zs = zoo_summary or (store.root / ZOO_SUMMARY)
    if zs.exists():
        try:
            d.zoo_summary = json.loads(zs.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise StoreError(f"bug-zoo summary {zs}: expected JSON, found invalid JSON ({e.msg})") from None
    zr = zoo_records or (store.root / ZOO_RECORDS)
    if zr.exists():
        d.zoo_records = read_records(zr)
    return d


def timings(store: EvalStore) -> pd.DataFrame:
    rows = []
    for m in store.manifests():
        k = m["key"]
        rows.append({"plan": m.get("plan_name"), "columns": ",".join(k["columns"]), "modes": ",".join(k["modes"]),
                     "fault": k.get("fault"), "seconds": m.get("seconds"), "forward_seconds": m.get("forward_seconds"),
                     "records": m.get("n_records"), "created": m.get("created")})
    return pd.DataFrame(rows)


__all__ = ["ReportData", "ZOO_RECORDS", "ZOO_SUMMARY", "load_report_data", "timings"]
