"""Whether the models a verdict builds fit the cards an estimate names, and what re-reading the streamed
reference from storage adds: the two facts a time-to-verdict figure is worthless without.

* **The native models are resident.** The reference streams one layer at a time; the native model does
  not: it is built whole on its device(s) (``dsv4.load_model``; ``--device-map`` spreads its layers over
  several GPUs of one process). A first-token run builds the logic column's FP32 model and the plan's
  model (floor, bug budget). Their weights (``parity.memory.model_weights``, the dry run's figures)
  against the card's memory, of which ``USABLE`` is assumed free for weights (the rest: activations,
  probes, the CUDA context), give the cards a device map needs; a row whose card count is short of that
  cannot run as estimated.
* **On one card, a native model larger than it streams** (``dsv4.streamed``, chosen by
  ``fit_check.streams_native``): the layers that fit ``USABLE`` of the card (less the embedding, the head
  and room for one transient layer) stay; every other layer is read from the checkpoint again on every
  pass over the model after the first (:func:`streamed_rereads`). A model whose embedding, head and
  largest layer do not fit at once cannot stream there either.
* **The streamed reference reads its checkpoint once a run.** A measured table's reference times hold
  reads from the page cache (the bench's few layers stay there). A full checkpoint larger than the host's
  memory cannot stay cached; the harness then runs a reference run's prompts layer by layer, so each
  layer is read from storage once a run: the checkpoint's bytes at the load rate the table measured.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .verdict_base import card_family, layer_params, slowest_load

# Vendor memory per card, bytes (data sheets); the usable share for weights is an assumption, named.
CARD_MEMORY_BYTES = {"H100": 80e9, "H200": 141e9, "B200": 192e9, "GB200": 186e9, "A100": 80e9, "L40S": 48e9}
USABLE = 0.9


@dataclass(frozen=True)
class Need:
    """One resident model: its weights and the cards of ``card`` a device map needs for them."""

    model: str
    weight_bytes: int
    cards: int | None        # None: the card's memory is unknown

    def describe(self, card: str) -> str:
        gib = f"{self.model} {self.weight_bytes / 2**30:.0f} GiB"
        return f"{gib}: memory of {card} unknown" if self.cards is None else f"{gib}: {self.cards} x {card_family(card)}"


def card_memory(card: str) -> float | None:
    return CARD_MEMORY_BYTES.get(card_family(card))


def model_needs(config: Any, card: str, columns: Sequence[str] = ("logic", "floor", "bug_budget"),
                plan: str = "default") -> list[Need]:
    """The resident native models of a run of ``columns`` and the cards of ``card`` each needs."""
    from dsv4.plan import resolve_plan

    from .fit_check import native_models
    from .memory import model_weights

    devices = {k: "gpu" for k in [*range(config.num_hidden_layers), "embed", "head"]}
    mem = card_memory(card)
    out = []
    for name, p in native_models(columns, resolve_plan(plan)):
        nbytes = model_weights(config, devices, p).total
        out.append(Need(name, nbytes, None if mem is None else max(1, math.ceil(nbytes / (USABLE * mem)))))
    return out


def fit_note(needs: Sequence[Need], card: str, cards: int, per_rank: bool = False) -> tuple[bool, str]:
    """(fits, a short note: each resident model's weights and the cards of ``card`` it needs, at
    ``USABLE`` of their memory). ``cards`` available; ``per_rank``: each rank holds its own copy (prompts
    or configurations over ranks), so one card must hold a model alone."""
    if not needs:
        return True, ""
    room = 1 if per_rank else cards
    listed = "; ".join(n.describe(card) for n in needs)
    if any(n.cards is not None and n.cards > room for n in needs):
        where = "one card a rank" if per_rank else f"{cards} card{'s' * (cards > 1)}"
        return False, f"does not fit {where}: {listed}"
    if any(n.cards is None for n in needs):
        return True, f"fit unknown: {listed}"
    return True, f"fits: {listed}"


def cards_needed(needs: Sequence[Need]) -> int | None:
    """The cards a device map needs for the largest resident model (None when unknown)."""
    known = [n.cards for n in needs if n.cards is not None]
    return max(known) if known and len(known) == len(needs) else None


@dataclass(frozen=True)
class Streamed:
    """One native model streamed on one card: the share of its layers' bytes re-read on each pass after
    the first (0: all resident), or ``feasible`` False when its embedding, head and largest layer exceed
    the card's usable memory."""

    model: str
    reread_share: float
    feasible: bool
    floor_bytes: int


def streamed_models(config: Any, card: str, columns: Sequence[str], plan: str = "default") -> list[Streamed] | None:
    """Each native model of a run of ``columns`` streamed on one ``card`` (None when its memory is unknown)."""
    from dsv4.plan import resolve_plan

    from .fit_check import native_models, part_bytes, streamed_floor

    mem = card_memory(card)
    if mem is None:
        return None
    out = []
    for name, p in native_models(columns, resolve_plan(plan)):
        need, _, _ = streamed_floor(config, p)
        layers = sum(v for k, v in part_bytes(config, p).items() if k not in ("embed", "head"))
        resident = max(0.0, USABLE * mem - need)               # room kept beside one transient layer
        out.append(Streamed(name, max(0.0, 1 - resident / layers) if layers else 0.0, need <= USABLE * mem, need))
    return out


def streamed_rereads(config: Any, card: str, columns: Sequence[str], passes: dict[str, int], one_build: float | None,
                     assumptions: list[str]) -> tuple[float, bool, str] | None:
    """(seconds re-reading streamed layers, whether every model can stream on one ``card``, a note), for
    ``passes[label]`` passes over each model's layers (``"logic"``, ``"plan"``) of which the first is its
    build, at ``one_build`` seconds a whole build. None when the card's memory is unknown."""
    models = streamed_models(config, card, columns)
    if models is None:
        return None
    seconds, notes, feasible = 0.0, [], True
    for m in models:
        if not m.feasible:
            feasible = False
            notes.append(f"{m.model}: its embedding, head and largest layer ({m.floor_bytes / 2**30:.0f} GiB) "
                         f"exceed one {card_family(card)}")
            continue
        if m.reread_share == 0:
            notes.append(f"{m.model} fits: built whole")
            continue
        n = passes.get("logic" if "(logic)" in m.model else "plan", 1)
        seconds += max(0, n - 1) * m.reread_share * (one_build or 0.0)
        notes.append(f"{m.model} streamed, {100 * m.reread_share:.0f} % of its layers re-read on each of {n - 1} "
                     f"passes after its build" if n > 1 else f"{m.model} streamed, each layer read once (one pass)")
    if feasible:
        assumptions.append(f"one {card_family(card)}: the native models stream (dsv4.streamed), the layers that fit "
                           f"{USABLE:.0%} of the card resident, the others re-read from the checkpoint on every pass "
                           f"at the measured load rate" + ("" if one_build else "; no load measured: re-reads not counted"))
    return seconds, feasible, "streamed: " + "; ".join(notes) if feasible else "cannot stream: " + "; ".join(notes)


def fit_or_stream(config: Any, card: str, cards: int, per_rank: bool, columns: Sequence[str], passes: dict[str, int],
                  one_build: float | None, assumptions: list[str], parts: dict[str, float], *,
                  may_stream: bool = True) -> tuple[bool, str, int | None]:
    """(fits, memory note, cards a device map needs) for an estimate's native models; on one card (one
    process, or each rank of a launch on its own card: ``per_rank``; no device map: ``may_stream``), a
    model larger than it streams: its re-reads (each rank's, which run at once) join ``parts`` as
    ``native_rereads``."""
    needs = model_needs(config, card, columns)
    fits, note = fit_note(needs, card, cards, per_rank)
    if fits or not may_stream or (cards != 1 and not per_rank):
        return fits, note, cards_needed(needs)
    st = streamed_rereads(config, card, columns, passes, one_build, assumptions)
    if st is None:
        return fits, note, cards_needed(needs)
    seconds, ok, snote = st
    if ok and seconds:
        parts["native_rereads"] = seconds
    return ok, snote if ok else f"{note}; {snote}", cards_needed(needs)


def reference_read_seconds(table: dict[str, Any], config: Any, forwards: int,
                           assumptions: list[str]) -> float | None:
    """Seconds the streamed reference spends reading its checkpoint from storage over ``forwards``
    forwards, when the full checkpoint is larger than the measured machine's host memory (else 0: it can
    stay in the page cache after the first). None when the table measured no reference checkpoint size
    or no read rate."""
    build = (table.get("build") or {}).get("official") or {}
    per_layer = build.get("per_layer_bytes") or {}
    slowest = slowest_load(table, with_bytes=True)
    host = (table.get("machine") or {}).get("host_memory_bytes")
    if not per_layer or slowest is None or not host:
        return None
    rate = slowest["disk_read_bytes"] / slowest["seconds"]
    layer_bytes = sum(per_layer.values()) / len(per_layer) * layer_params(config) / layer_params(table["config"])
    total = layer_bytes * config.num_hidden_layers
    if total <= host:
        assumptions.append(f"the reference checkpoint ({total / 1e9:.0f} GB) fits the host's "
                           f"{host / 1e9:.0f} GB of memory: its streamed reads come from the page cache")
        return 0.0
    assumptions.append(f"the reference checkpoint ({total / 1e9:.0f} GB) exceeds the host's {host / 1e9:.0f} GB: "
                       f"each of {forwards} reference run(s) reads it from storage once (its prompts layer by layer, "
                       f"parity.layer_major_column) at the measured {rate / 1e9:.2f} GB/s (a reference cache from an "
                       f"earlier run of the same prompts skips them)")
    return forwards * total / rate


__all__ = ["CARD_MEMORY_BYTES", "USABLE", "Need", "Streamed", "card_memory", "fit_or_stream", "streamed_models", "streamed_rereads", "cards_needed", "fit_note", "model_needs",
           "reference_read_seconds"]
