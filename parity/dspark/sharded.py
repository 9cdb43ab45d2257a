"""DSpark draft parity with the prompts spread over the ranks of a ``torchrun`` launch (one door:
``run_draft_parity_sharded``; ``torchrun --nproc-per-node N -m parity.dspark ...`` needs no flag).

Why: the tiny built-in model is launch-bound on a GPU (thousands of microsecond kernels per trunk
pass), so one process leaves the GPU idle most of the time; ranks sharing one GPU run their prompts
side by side. Ranks may outnumber GPUs here (``parity.distributed.init(shared_gpus=True)``): only
Python objects cross processes.

Each rank runs every column on its prompts (``shard``: prompt i on rank i % N), the parts are
gathered and merged into the result one process would have produced: rows, speculations, greedy
runs and audit tallies in prompt order. One process state carries over between prompts: under
``act_scale="frozen"`` each linear keeps the global scale of its first call, which one process makes
on prompt 1. A rank whose share starts elsewhere first replays prompt 1's draft calls
(``DraftSpec.freeze_prompt``, not audited, results dropped), so every prompt is judged with the
scales one process would use."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .run import ColumnRun, DraftParityResult, DraftSpec, Progress, run_draft_parity


def run_draft_parity_sharded(spec: DraftSpec, progress: Progress | None = None) -> DraftParityResult:
    from ..distributed import all_gather, current, shard

    w = current()
    if not w.active:
        return run_draft_parity(spec, progress)
    mine = shard(spec.prompts, w)
    part = None
    if mine:
        first = spec.prompts[0]
        freeze = None if mine[0].id == first.id else first
        part = run_draft_parity(replace(spec, prompts=mine, freeze_prompt=freeze), progress)
        part = replace(part, spec=None)     # the source holds open files: it stays on its rank
    parts = [p for p in all_gather(part) if p is not None]
    return merge(spec, parts)


def merge(spec: DraftSpec, parts: list[DraftParityResult]) -> DraftParityResult:
    """One result from the prompt shards (``parts``: the ranks that had prompts, in rank order)."""
    from ..distributed import _merge_audit

    order = {p.id: i for i, p in enumerate(spec.prompts)}
    columns: dict[str, ColumnRun] = {}
    for name in parts[0].columns:
        cs = [p.columns[name] for p in parts]
        base = cs[0]
        if not base.ran:
            columns[name] = base
            continue
        col = ColumnRun(name, base.anchor, base.test, True, base.reason)
        col.rows = sorted((r for c in cs for r in c.rows), key=lambda r: order[r["prompt"]])   # stable
        for attr in ("spec", "greedy"):
            merged: dict[str, dict[str, Any]] = {}
            for c in cs:
                for key, per_prompt in getattr(c, attr).items():
                    merged.setdefault(key, {}).update(per_prompt)
            setattr(col, attr, {k: dict(sorted(v.items(), key=lambda kv: order[kv[0]])) for k, v in merged.items()})
        audits = [c.audit for c in cs if c.audit]
        col.audit = _merge_audit(audits) if audits else {}
        col.weight_audit = base.weight_audit       # one model: every rank's weight audit is the same
        columns[name] = col
    return DraftParityResult(spec, columns)
