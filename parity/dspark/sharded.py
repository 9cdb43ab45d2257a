"""DSpark draft parity spread over the ranks of a ``torchrun`` launch (one door:
``run_draft_parity_sharded``; ``torchrun --nproc-per-node N -m parity.dspark ...`` needs no flag).

Why: the tiny built-in model is launch-bound on a GPU (thousands of microsecond kernels per trunk
pass), so one process leaves the GPU idle most of the time; ranks sharing one GPU run side by side
(measured on an H100: 8 processes each launching tiny kernels ran at 8-12 us a launch, against 8 us
alone). Ranks may outnumber GPUs here (``parity.distributed.init(shared_gpus=True)``): only Python
objects cross processes.

The unit of work is one (column, prompt): unit i of the column-major list goes to rank i % N, so
N = prompts gives each rank one prompt of every column, and N = columns x prompts one unit each
(the bug-budget column, kernels and audit, costs about 3x a logic unit: more ranks than prompts
shorten the longest rank). The parts are gathered and merged into the result one process would have
produced: rows, speculations, greedy runs and audit tallies in prompt order. One process state
carries over between prompts: under ``act_scale="frozen"`` each linear keeps the global scale of its
first call, which one process makes on prompt 1 of each column (each column loads its own sides). A
rank whose share of a column starts elsewhere first replays prompt 1's draft calls
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
    units = [(c, p) for c in spec.columns for p in spec.prompts]
    mine: dict[str, list[Any]] = {}
    for column, prompt in shard(units, w):
        mine.setdefault(column, []).append(prompt)     # in prompt order: the shard keeps the list's order
    part = None
    if mine:
        first = spec.prompts[0]
        columns: dict[str, ColumnRun] = {}
        for column, prompts in mine.items():
            freeze = None if prompts[0].id == first.id else first
            sub = replace(spec, prompts=prompts, columns=[column], freeze_prompt=freeze)
            columns.update(run_draft_parity(sub, progress).columns)
        part = DraftParityResult(None, columns)     # the source holds open files: it stays on its rank
    parts = [p for p in all_gather(part) if p is not None]
    return merge(spec, parts)


def merge(spec: DraftSpec, parts: list[DraftParityResult]) -> DraftParityResult:
    """One result from the (column, prompt) shards (``parts``: the ranks that had units, in rank order)."""
    from ..distributed import _merge_audit

    order = {p.id: i for i, p in enumerate(spec.prompts)}
    columns: dict[str, ColumnRun] = {}
    for name in spec.columns:
        cs = [p.columns[name] for p in parts if name in p.columns]
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
        # the first violation one process would meet: the one of the earliest prompt
        audits.sort(key=lambda a: order.get((a.get("first") or {}).get("prompt_id"), len(order)))
        col.audit = _merge_audit(audits) if audits else {}
        col.weight_audit = base.weight_audit       # one model: every rank's weight audit is the same
        columns[name] = col
    return DraftParityResult(spec, columns)
