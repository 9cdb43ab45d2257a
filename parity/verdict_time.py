"""Time to verdict, estimated before a run from measured per-layer tables (``--dry-run``).

A table is what ``benchmarks/bench_real_width.py`` writes (kept under ``benchmarks/results/
real_width*.json``, the card named in it): seconds per layer kind (window / CSA / HCA attention x
hash / score routing) for the streaming reference and each native backend at a few prefill lengths.
An estimate picks the table measured on this machine's card; without one it takes the closest (same
device type first, then the most recent: the bench's date, else the file order) and scales it, each assumption written beside the number:

* another card: per-layer time x (table card's memory bandwidth / this card's), both from
  :data:`BANDWIDTH_TBS` (streamed layers are read and dequantized once per forward: bandwidth-bound);
* another width / model: x (this config's parameters per layer kind / the table's);
* another prompt length: linear in tokens between (and beyond) the measured lengths;
* the harness (probes, isolated pass, metrics, per-call audit): x (1 + the overhead the table measured
  per prompt); the weight audit once per checkpoint, x the hidden-size ratio (identity GEMMs);
* the logic column's FP32 forwards: 2x the BF16 ones (twice the bytes per activation).
* loads (reading the checkpoint into the native model): the table's slowest load per layer x the
  parameters ratio, never the bandwidth ratio (storage and the host link bound a load; the rate
  measured is written out), x the ranks that load at once from one storage.
* memory and storage (``parity.verdict_fit``): whether the resident native models fit the cards named
  (else the cards a device map needs), and the streamed reference's reads of a checkpoint larger
  than the host's memory, once per reference forward.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .verdict_base import BANDWIDTH_TBS, card_family, layer_params, slowest_load

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FP32_FACTOR = 2.0


def this_card() -> str:
    import os

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({os.cpu_count()} cores)"


def load_tables(root: Path | None = None) -> list[dict[str, Any]]:
    root = RESULTS if root is None else root
    out = []
    for f in sorted(root.glob("real_width*.json")) if root.is_dir() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if d.get("bench") == "real_width" and d.get("runs"):
            d["_file"] = str(f)
            out.append(d)
    return out


def kind_of(config: Any, i: int) -> str:
    return f"{config.layer_kind(i)}/{'hash' if i < config.num_hash_layers else 'score'}"


@dataclass
class Estimate:
    seconds: float
    table: str
    card: str
    table_card: str
    assumptions: list[str] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)
    fits: bool = True          # the resident native models fit the cards named (parity.verdict_fit)
    fit: str = ""
    cards_needed: int | None = None   # cards of this kind a device map needs for the largest of them

    def lines(self) -> list[str]:
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in self.breakdown.items())
        out = [f"time to verdict (estimate): {fmt_seconds(self.seconds)} on {self.card} [{parts}]",
               f"  from the measured table {self.table} ({self.table_card})"]
        if self.fit:
            out.append(f"  {'memory' if self.fits else 'MEMORY'}: {self.fit}")
        out += [f"  assumption: {a}" for a in self.assumptions]
        return out


def fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def complete(table: dict[str, Any]) -> bool:
    """Whether an estimate can use the table whole: prefills of the streaming reference, ``emulated`` and
    a kernel backend, and a measured harness overhead. Partial runs (the reference alone for its memory
    flatness, a long prefill without the harness) are kept beside it but never picked over it."""
    pre = {(r.get("side"), r.get("backend")) for r in table.get("runs", []) if r.get("phase") == "prefill"}
    kernel = any(side == "native" and b != "emulated" for side, b in pre)
    harness = any(h.get("overhead_ratio") is not None for h in table.get("harness", []))
    return ("native", "emulated") in pre and kernel and any(side == "reference" for side, _ in pre) and harness


def pick_table(tables: Sequence[dict[str, Any]], card: str,
               model: str | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    """The table measured on ``card`` (of ``model``, the config's name, where one is: its own layer
    shapes need no parameter scaling), else the closest card's, of ``model`` first."""
    def own(ts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [t for t in ts if model is not None and t.get("model") == model] or list(ts)

    # recency: the bench's date where it wrote one, else the results' file order (_s2 before _s3)
    order = {id(t): i for i, t in enumerate(tables)}

    def recency(t: dict[str, Any]) -> tuple[str, int]:
        return t.get("date", ""), order[id(t)]

    same = own([t for t in tables if t["machine"]["card"] == card])
    if same:
        return max(same, key=lambda t: (complete(t), *recency(t))), []
    fam = card_family(card)
    gpu = fam != "cpu"
    ranked = sorted(tables, key=lambda t: ((card_family(t["machine"]["card"]) != "cpu") == gpu,
                                           card_family(t["machine"]["card"]) == fam, complete(t),
                                           model is not None and t.get("model") == model, *recency(t)))
    if not ranked:
        return None, []
    t = ranked[-1]
    return t, [f"no measured table for this machine ({card}); scaled from {t['machine']['card']} "
               f"({Path(t['_file']).name})"]


def per_kind(table: dict[str, Any], side: str, backend: str) -> dict[str, dict[int, float]]:
    """kind -> tokens -> mean seconds of one layer of that kind, prefill."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in table["runs"]:
        if r["side"] == side and r.get("backend") == backend and r.get("phase") == "prefill":
            for x in r["layers"]:
                out.setdefault(x["kind"], {}).setdefault(int(r["tokens"]), []).append(x["seconds"])
    return {k: {t: sum(v) / len(v) for t, v in d.items()} for k, d in out.items()}


def at_tokens(points: dict[int, float], tokens: int) -> float:
    """Linear in tokens through the two nearest measured lengths (one length: proportional)."""
    ts = sorted(points)
    if len(ts) == 1:
        return points[ts[0]] * tokens / ts[0]
    lo, hi = (ts[0], ts[1]) if tokens <= ts[0] else (ts[-2], ts[-1]) if tokens >= ts[-1] else \
        next((a, b) for a, b in zip(ts, ts[1:]) if a <= tokens <= b)
    slope = (points[hi] - points[lo]) / (hi - lo)
    return max(points[lo] + slope * (tokens - lo), 0.0)


def points_for_kind(kinds: dict[str, Any], kind: str) -> Any:
    """The measured points of layer ``kind``; a kind the table lacks takes the same attention's, else any."""
    same_attention = next((x for x in kinds if x.split("/")[0] == kind.split("/")[0]), "")
    return kinds.get(kind) or kinds.get(same_attention) or next(iter(kinds.values()))


def side_seconds(table: dict[str, Any], side: str, backend: str, config: Any, tokens: Sequence[int]) -> float | None:
    kinds = per_kind(table, side, backend)
    if not kinds:
        return None
    total = 0.0
    for i in range(config.num_hidden_layers):
        k = kind_of(config, i)
        pts = points_for_kind(kinds, k)
        total += sum(at_tokens(pts, t) for t in tokens)
    return total


def harness_overhead(table: dict[str, Any], assumptions: list[str]) -> tuple[float, float | None]:
    """(the overhead ratio the forwards are multiplied by, the weight audit's seconds per layer or None).
    A table that measured the overhead a further prompt adds gives that ratio and its weight audit,
    counted once (it is per checkpoint, whatever the prompt count); an older one gives the whole run's
    ratio, which holds the audit once per prompt (an over-estimate beyond one prompt)."""
    hs = [h for h in table.get("harness", []) if h.get("overhead_ratio") is not None]
    per = [h for h in hs if h.get("per_prompt_overhead_ratio") is not None]
    if per:
        ovr = max(0.0, max(h["per_prompt_overhead_ratio"] for h in per))
        audit = max(h["phases"].get("weight_audit", 0.0) for h in per) / table["config"]["num_hidden_layers"]
        assumptions.append(f"harness overhead per prompt x {1 + ovr:.2f} (measured; loads and weight audit apart)")
        return ovr, audit
    ovr = max(0.0, max(h["overhead_ratio"] for h in hs)) if hs else 0.25   # below 0: timing noise, not a speed-up
    assumptions.append(f"harness overhead x {1 + ovr:.2f} ({'measured' if hs else 'the 25 % target, none measured'})")
    return ovr, None


def table_scale(config: Any, table: dict[str, Any], card: str, assumptions: list[str]) -> float:
    """The factor a table's per-layer times are multiplied by for ``config`` on ``card`` (bandwidth of
    the two cards, parameters per layer of the two configs), each factor written to ``assumptions``."""
    scale, tc = 1.0, table["machine"]["card"]
    if tc != card:
        bw_here, bw_there = BANDWIDTH_TBS.get(card_family(card)), BANDWIDTH_TBS.get(card_family(tc))
        if bw_here and bw_there:
            scale *= bw_there / bw_here
            assumptions.append(f"layer time x {bw_there / bw_here:.2f} = memory bandwidth {tc} {bw_there} TB/s / "
                               f"{card} {bw_here} TB/s")
        else:
            assumptions.append(f"bandwidth of {card!r} unknown: per-layer times of {tc} used as they are")
    p_here, p_there = layer_params(config), layer_params(table["config"])
    if abs(p_here / p_there - 1) > 1e-6:
        scale *= p_here / p_there
        assumptions.append(f"layer time x {p_here / p_there:.3g} = parameters per layer {config.name} / "
                           f"{table['config']['name']}")
    return scale


def load_seconds_per_layer(table: dict[str, Any]) -> float | None:
    """The slowest measured model load of the table, per layer (None when it measured none)."""
    slowest = slowest_load(table)
    return slowest["seconds"] / table["config"]["num_hidden_layers"] if slowest else None


def load_seconds(table: dict[str, Any], config: Any, loads: int, assumptions: list[str], *,
                 readers: int = 1) -> float | None:
    """``loads`` builds of ``config``'s native model from its checkpoint, at the table's slowest measured
    load (None when it measured none). A load reads the checkpoint: storage and the host link bound it,
    not the card's memory, so only the bytes scale (parameters per layer), never the bandwidth ratio of
    :func:`table_scale`. With ``readers`` ranks loading at once, each is assumed to read at that rate,
    and the aggregate rate the node's storage must then serve is written out (the check a user makes)."""
    per_layer = load_seconds_per_layer(table)
    if per_layer is None or loads < 1:
        return None
    slowest = slowest_load(table)
    read = slowest.get("disk_read_bytes")
    gbs = read / slowest["seconds"] / 1e9 if read else None
    rate = (f"{gbs:.2f} GB/s: {read / 1e9:.1f} GB read from its disk in {slowest['seconds']:.1f} s" if gbs
            else f"{slowest['seconds']:.1f} s, bytes read not recorded")
    p = layer_params(config) / layer_params(table["config"])
    note = (f"{loads} native load{'s' * (loads > 1)} at the slowest measured on {table['machine']['card']}'s machine "
            f"({rate}), x {p:.3g} parameters per layer; not scaled by memory bandwidth: storage and the host "
            f"link decide, and another machine's may be much faster")
    if readers > 1:
        need = f"{readers * gbs:.1f} GB/s" if gbs else f"{readers} times that rate"
        note += (f"; {readers} ranks load at once, each at that rate: the node's storage (or page cache) must serve "
                 f"{need}, else the loads take longer")
    assumptions.append(note)
    return loads * per_layer * p * config.num_hidden_layers


def estimate(config: Any, tokens: Sequence[int], columns: Sequence[str], card: str | None = None,
             tables: Sequence[dict[str, Any]] | None = None, readers: int = 1, cards: int = 1,
             per_rank: bool = False, may_stream: bool = True) -> Estimate | None:
    """The forwards a first-token run performs for prompts of ``tokens`` tokens, from a measured table
    (``readers``: ranks of one launch loading their models at once, :func:`load_seconds`); whether its
    resident models fit ``cards`` cards (each rank's own when ``per_rank``) and the streamed reference's
    reads from storage (``parity.verdict_fit``). ``may_stream`` False: a device map was given, so a model
    too large for one card is not streamed there (``fit_check.streams_native``)."""
    card = card or this_card()
    tables = load_tables() if tables is None else tables
    table, notes = pick_table(tables, card, getattr(config, "name", None))
    if table is None:
        return None
    assumptions = list(notes)
    tc = table["machine"]["card"]
    scale = table_scale(config, table, card, assumptions)
    assumptions.append(f"prompt lengths {sorted(set(tokens))} linear in tokens from the measured "
                       f"{sorted({r['tokens'] for r in table['runs'] if r.get('phase') == 'prefill'})}")
    ref = side_seconds(table, "reference", "reference(streaming)", config, tokens)
    emu = side_seconds(table, "native", "emulated", config, tokens)
    kernels = sorted({r["backend"] for r in table["runs"] if r["side"] == "native" and r["backend"] != "emulated"
                      and r.get("phase") == "prefill"})
    ker = side_seconds(table, "native", kernels[0], config, tokens) if kernels else None
    if ref is None or emu is None:
        return None
    b: dict[str, float] = {}
    if "logic" in columns:
        b["logic"] = FP32_FACTOR * (ref + 2 * emu)
    if "floor" in columns or "bug_budget" in columns:
        b["floor"] = ref + 2 * emu
    if "bug_budget" in columns and ker is not None:
        b["bug_budget"] = 2 * ker
    elif "bug_budget" in columns:
        assumptions.append("no kernel backend in the table: bug-budget column not counted")
    ovr, audit = harness_overhead(table, assumptions)
    if "logic" in b:
        assumptions.append(f"FP32 logic forwards = {FP32_FACTOR:g} x the BF16 ones")
    b = {k: v * scale * (1 + ovr) for k, v in b.items()}
    if audit is not None and "bug_budget" in b:
        k_ratio = config.hidden_size / table["config"]["hidden_size"]
        b["weight_audit"] = audit * scale * k_ratio * config.num_hidden_layers
        assumptions.append(f"weight audit once per checkpoint: {audit:.3g} s a layer measured, x {k_ratio:.3g} = hidden "
                           f"size {config.hidden_size} / {table['config']['hidden_size']} (identity GEMMs: K x weights)")
    # native models built from the checkpoint: the logic column's and the floor's; the bug-budget column runs
    # the floor's on the kernel backend (NativeModel.switch_backend) and the weight audit reads it: no build;
    # the reference streams, its reads counted apart below
    builds = sum(k in b for k in ("logic", "floor"))
    loads = load_seconds(table, config, builds, assumptions, readers=readers)
    if loads is not None:
        b["loads"] = loads
    from .verdict_fit import fit_or_stream, reference_read_seconds

    # a reference run (one a column) takes its prompts layer by layer when it reads from storage: one read each
    reads = reference_read_seconds(table, config, ("logic" in b) + ("floor" in b), assumptions)
    if reads:
        b["reference_reads"] = reads
    # passes over each streamed native model: one a column (every prompt layer by layer,
    # parity.layer_major_column), the weight audit's walk one more
    passes = {"logic": 1, "plan": ("floor" in b) + 2 * ("bug_budget" in b)}
    fits, note, need = fit_or_stream(config, card, cards, per_rank, columns, passes,
                                     load_seconds(table, config, 1, []), assumptions, b, may_stream=may_stream)
    return Estimate(sum(b.values()), Path(table["_file"]).name, card, tc, assumptions, b, fits, note, need)


__all__ = ["BANDWIDTH_TBS", "Estimate", "card_family", "layer_params", "estimate", "load_seconds", "load_seconds_per_layer", "load_tables", "pick_table",
           "points_for_kind", "table_scale", "this_card"]
