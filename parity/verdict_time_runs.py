"""Time to verdict of the runs beyond first-token parity, from the same measured tables as
:mod:`parity.verdict_time`: a teacher-forced decode (``parity.decode``) and a floor search
(``precision_floor.search``).

* ``decode_estimate(config, steps, prompt_tokens)``: one prompt prefilled, then ``steps`` decode steps
  on both sides (the reference first, then the native model on its kernel backend: one model at a time,
  as the run does). Per layer kind, the step time the table measured after its decode cache, linear in
  the cache length between measured caches and held flat beyond them (a step reads the weights once; the
  cache adds a little per token), at the cache the run averages (prompt + steps / 2). The native side
  is multiplied by the harness overhead the table measured per prompt (probes, the per-call audit of
  every eager step), an assumption: the decode's own overhead is not measured at real width.
* ``floor_search_estimate(config, configurations, tokens)``: the reference once for the prompt set
  (cached and shared by every configuration), then per configuration one native load on ``emulated``
  and a propagated forward per prompt (the search scores the floor column's propagated records),
  times the measured harness overhead (an over-estimate: that overhead holds the per-call audit, which
  the floor column does not run).

Layers only: the embedding and the LM head per step are not in the per-layer tables. Each factor is
written beside the number (``Estimate.assumptions``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .verdict_time import (Estimate, harness_overhead, kind_of, load_seconds, load_tables, pick_table,
                           points_for_kind, side_seconds, table_scale, this_card)

from .verdict_fit import fit_or_stream, reference_read_seconds

REFERENCE = ("reference", "reference(streaming)")


def decode_points(table: dict[str, Any], side: str, backend: str | None) -> dict[str, dict[int, float]]:
    """kind -> decode cache tokens -> seconds of one step through one layer of that kind."""
    out: dict[str, dict[int, float]] = {}
    for d in table.get("decode", []):
        if d.get("side") != side or (backend is not None and d.get("backend") != backend):
            continue
        for x in d.get("layers", []):
            out.setdefault(x["kind"], {})[int(d["cache_tokens"])] = float(x["seconds_per_step"])
    return out


def at_cache(points: dict[int, float], cache: int) -> float:
    """Linear in the cache length between the measured caches, flat beyond them."""
    ts = sorted(points)
    if cache <= ts[0]:
        return points[ts[0]]
    if cache >= ts[-1]:
        return points[ts[-1]]
    lo, hi = next((a, b) for a, b in zip(ts, ts[1:]) if a <= cache <= b)
    return points[lo] + (points[hi] - points[lo]) * (cache - lo) / (hi - lo)


def step_seconds(points: dict[str, dict[int, float]], config: Any, cache: int) -> float:
    """One decode step through every layer of ``config`` (a kind the table lacks: the same attention, else
    any measured kind)."""
    return sum(at_cache(points_for_kind(points, kind_of(config, i)), cache) for i in range(config.num_hidden_layers))


def _kernel_backend(table: dict[str, Any]) -> str | None:
    names = sorted({d["backend"] for d in table.get("decode", []) if d.get("side") == "native"})
    return next((b for b in names if b != "emulated"), names[0] if names else None)


def _pick(config: Any, card: str | None, tables: Sequence[dict[str, Any]] | None,
          need: Any) -> tuple[dict[str, Any], str, list[str]] | None:
    """The most fitting table that has what ``need(table)`` asks for (a decode, a native emulated prefill)."""
    card = card or this_card()
    usable = [t for t in (load_tables() if tables is None else tables) if need(t)]
    table, notes = pick_table(usable, card, getattr(config, "name", None))
    return None if table is None else (table, card, list(notes))


def decode_estimate(config: Any, steps: int = 300, prompt_tokens: int = 1024, card: str | None = None,
                    tables: Sequence[dict[str, Any]] | None = None, cards: int = 1) -> Estimate | None:
    """A teacher-forced decode of one prompt: both sides' prefill, ``steps`` steps each, and their loads;
    whether the native model fits ``cards`` cards (``parity.verdict_fit``)."""
    def has_decode(t: dict[str, Any]) -> bool:
        return bool(decode_points(t, "reference", None)) and bool(decode_points(t, "native", None))

    picked = _pick(config, card, tables, has_decode)
    if picked is None:
        return None
    table, card, assumptions = picked
    scale = table_scale(config, table, card, assumptions)
    backend = _kernel_backend(table)
    cache = prompt_tokens + steps // 2
    measured = sorted({int(d["cache_tokens"]) for d in table.get("decode", [])})
    assumptions.append(f"decode step per layer at a {cache}-token cache (the run's mean), from the measured caches "
                       f"{measured}: linear between them, flat beyond; layers only (embedding and head not counted)")
    ref_step = step_seconds(decode_points(table, "reference", None), config, cache)
    nat_step = step_seconds(decode_points(table, "native", backend), config, cache)
    b: dict[str, float] = {"reference_decode": steps * ref_step * scale}
    ovr, _ = harness_overhead(table, assumptions)
    assumptions[-1] += f"; applied to the native {backend} decode (probes, per-call audit of every eager step)"
    b["native_decode"] = steps * nat_step * scale * (1 + ovr)
    ref_prefill = side_seconds(table, *REFERENCE, config, [prompt_tokens])
    nat_prefill = side_seconds(table, "native", backend, config, [prompt_tokens]) if backend else None
    b["prefills"] = ((ref_prefill or 0.0) + (nat_prefill or 0.0)) * scale
    loads = load_seconds(table, config, 1, assumptions)     # the native model (the reference streams)
    if loads is not None:
        b["loads"] = loads
    ref_prefill_reads = reference_read_seconds(table, config, 1, assumptions)
    if ref_prefill_reads:
        b["reference_reads"] = ref_prefill_reads
    assumptions.append("reference decode steps at their measured time (weights from the page cache); a step "
                       "reads only its routed experts, which at full size may come from storage: not counted")
    # streamed on one card: teacher-forced, the decode runs layer by layer (dsv4.decode.layer_major), one pass
    fits, note, need = fit_or_stream(config, card, cards, False, ("floor",), {"plan": 1},
                                     load_seconds(table, config, 1, []), assumptions, b)
    return Estimate(sum(b.values()), Path(table.get("_file", "?")).name, card, table["machine"]["card"],
                    assumptions, b, fits, note, need)


def floor_search_estimate(config: Any, configurations: int, tokens: Sequence[int], card: str | None = None,
                          tables: Sequence[dict[str, Any]] | None = None, readers: int = 1, cards: int = 1,
                          per_rank: bool = False) -> Estimate | None:
    """A floor search visiting ``configurations`` plans over prompts of ``tokens`` tokens (``readers``:
    ranks loading at once from one storage, ``verdict_time.load_seconds``)."""
    if configurations < 1:
        raise ValueError(f"floor search: configurations expected >= 1, found {configurations}")

    def has_emulated(t: dict[str, Any]) -> bool:
        return any(r.get("side") == "native" and r.get("backend") == "emulated" and r.get("phase") == "prefill"
                   for r in t.get("runs", []))

    picked = _pick(config, card, tables, has_emulated)
    if picked is None:
        return None
    table, card, assumptions = picked
    scale = table_scale(config, table, card, assumptions)
    ref = side_seconds(table, *REFERENCE, config, tokens)
    emu = side_seconds(table, "native", "emulated", config, tokens)
    if ref is None or emu is None:
        return None
    ovr, _ = harness_overhead(table, assumptions)
    assumptions[-1] += " (an over-estimate here: it holds the per-call audit, which the floor column does not run)"
    assumptions.append(f"{configurations} configurations, each one emulated load and one propagated forward a "
                       f"prompt; the reference once, cached and shared")
    b = {"reference": ref * scale * (1 + ovr), "configurations": configurations * emu * scale * (1 + ovr)}
    loads = load_seconds(table, config, configurations, assumptions, readers=readers)
    if loads is not None:
        b["loads"] = loads
    reads = reference_read_seconds(table, config, 1, assumptions)   # its prompts layer by layer: one read
    if reads:
        b["reference_reads"] = reads
    # the default plan's model: a configuration holding components in BF16 needs more, not counted
    # streamed on one card: a configuration's column runs every prompt layer by layer (one pass: its build)
    fits, note, need = fit_or_stream(config, card, cards, per_rank, ("floor",), {"plan": 1},
                                     load_seconds(table, config, 1, []), assumptions, b)
    return Estimate(sum(b.values()), Path(table.get("_file", "?")).name, card, table["machine"]["card"],
                    assumptions, b, fits, note, need)


__all__ = ["decode_estimate", "floor_search_estimate"]
