"""Precision-floor studies over the ranks of a ``torchrun`` launch (``parity.distributed`` is the door).

``torchrun --nproc-per-node N -m precision_floor.flips ...`` (or ``.search``, ``.attribution``,
``.report``) runs the same study on every rank in lockstep; every evaluation the study asks for goes
through :func:`prefetch` (``Scorer.evaluate`` calls it for one plan, the studies for the batches they
know ahead: the flip plans, a search step's candidates), which:

1. lets rank 0 decide which of the plans the store lacks (one view of the store for every rank);
2. computes the reference outputs of the prompts once, split over the ranks, into the store's
   shared reference cache (so no two ranks run the same reference);
3. gives each rank every N-th missing plan; each evaluation is written by the rank that computed it,
   atomically, as one store entry (records then manifest: ``precision_floor.cache``): there is one
   writer per entry, nothing to merge, and a killed rank loses only the evaluation in flight —
   ``--resume`` on the next launch (any number of ranks) reads every finished one;
4. tells every rank which digests were computed, so each reads them from the store even without
   ``--resume``.

Study summaries (``<study>.json``) are written by rank 0 (``EvalStore.write_json``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from parity.distributed import all_gather, barrier, broadcast, check_shared_dir, current, shard

if TYPE_CHECKING:
    from dsv4.plan import PrecisionPlan
    from .evaluate import Scorer


def prefetch(ev: Scorer, plans: Sequence[PrecisionPlan], columns: Sequence[str], backend: str) -> list[str]:
    """Evaluate the plans ``ev`` lacks, spread over the ranks; return the digests computed (every rank
    gets the same list). Collective: every rank calls it with the same plans."""
    w = current()
    keys, seen = [], set()
    for plan in plans:
        key = ev.key(plan, columns, backend)
        if key.digest() not in seen:
            seen.add(key.digest())
            keys.append((plan, key))
    missing = [i for i, (_, k) in enumerate(keys) if k.digest() not in ev._session and not ev.stored(k)]
    todo = [keys[i] for i in broadcast(missing)]
    if not todo:
        for plan, key in keys:          # stored already: read on every rank (same sessions everywhere)
            ev._evaluate_here(plan, key, columns, backend)
        return []
    _warm_reference(ev, columns)
    mine = shard(todo, w)
    for plan, key in mine:
        ev._evaluate_here(plan, key, columns, backend)
    computed = [d for part in all_gather([k.digest() for _, k in mine]) for d in part]
    ev.mark_computed(computed)
    # every rank reads the whole batch now, so every rank's session holds the same evaluations and
    # the study's later evaluate() calls make the same collectives on every rank (lockstep)
    for plan, key in todo:
        ev._evaluate_here(plan, key, columns, backend)
    return computed


def _warm_reference(ev: Scorer, columns: Sequence[str]) -> None:
    """The anchors every evaluation of ``columns`` reads, computed once: each rank runs the reference on
    its share of the prompts into the store's reference cache (the cache is keyed by checkpoint,
    oracle code, profile, dtype and tokens: a fault study's native faults do not change it)."""
    from parity.threeway import RunSpec, run_reference

    pairs = (["logic"] if "logic" in columns else []) + (["floor"] if {"floor", "bug_budget"} & set(columns) else [])
    warmed: set[str] = ev.__dict__.setdefault("_warmed_pairs", set())
    pairs = [p for p in pairs if p not in warmed]
    if not pairs:
        return
    if not warmed:
        check_shared_dir(ev.store.root, "--records")
    mine = shard(ev.prompts)
    if mine:
        spec = RunSpec(source=ev.source, prompts=mine, profile=ev.context.profile, device=ev.device,
                       settings=ev.settings, reference_cache=ev.store.reference_dir, columns=tuple(columns),
                       fault=ev.context.fault)
        for pair in pairs:
            run_reference(spec, ev.context.profile, ev.loaders, pair=pair)
    barrier()
    warmed.update(pairs)


__all__ = ["prefetch"]
