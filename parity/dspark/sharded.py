"""DSpark draft parity spread over the ranks of a ``torchrun`` launch (one door:
``run_draft_parity_sharded``; ``torchrun --nproc-per-node N -m parity.dspark ...`` needs no flag).

Why: the tiny built-in model is launch-bound on a GPU (thousands of microsecond kernels per trunk
pass), so one process leaves the GPU idle most of the time; ranks sharing one GPU run side by side
(measured on an H100: 8 processes each launching tiny kernels ran at 8-12 us a launch, against 8 us
alone). Ranks may outnumber GPUs here (``parity.distributed.init(shared_gpus=True)``): only Python
objects cross processes.

The unit of work is one (column, part, prompt), dealt round robin over the ranks, costliest first. A
part is what a column does per prompt (``run.PARTS``: the compared draft calls, the speculative
pairs, plain greedy decoding); every column is one part but the bug budget, whose kernels and audit
of every call cost several logic prompts (H100: over 100 s against 22 s): it is two, so that no rank
holds a whole bug-budget prompt. 15 ranks on 5 prompts: ten hold a bug-budget half each, five of them
a logic prompt besides, and five a floor prompt. The parts are gathered and merged into the result one process would
have produced: rows, speculations, greedy runs and audit tallies in prompt order.

One process state carries over between prompts: under ``act_scale="frozen"`` each linear keeps the
global scale of its first call, which one process makes in the draft calls of prompt 1 of each
column (each column loads its own sides). A unit that does not start with those calls first replays
prompt 1's draft calls (``DraftSpec.freeze_prompt``, not audited, results dropped), so every prompt is
judged with the scales one process would use."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from .run import PAIRS, PARTS, ColumnRun, DraftParityResult, DraftSpec, Progress, run_draft_parity

# the bug budget's two halves: (draft calls, the pairs of one target) and (the crossed pairs, greedy)
SPLIT = {"bug_budget": (("draft_calls", "anchor+anchor", "test+test"), ("anchor+test", "test+anchor", "greedy"))}
COSTLIEST_FIRST = ("bug_budget", "floor", "logic")


def units(spec: DraftSpec) -> list[tuple[str, tuple[str, ...], Any]]:
    """Every (column, part, prompt) of the run, costliest columns first, prompts in order."""
    out = []
    for column in sorted(spec.columns, key=COSTLIEST_FIRST.index):
        for part in SPLIT.get(column, (PARTS,)):
            part = tuple(q for q in part if q in spec.parts)
            if part:
                out += [(column, part, p) for p in spec.prompts]
    return out


def run_draft_parity_sharded(spec: DraftSpec, progress: Progress | None = None) -> DraftParityResult:
    from ..distributed import all_gather, current, shard

    w = current()
    if not w.active:
        return run_draft_parity(spec, progress)
    mine: dict[tuple[str, tuple[str, ...]], list[Any]] = {}
    for column, part, prompt in shard(units(spec), w):
        mine.setdefault((column, part), []).append(prompt)     # in prompt order: the shard keeps it
    first = spec.prompts[0]
    runs: list[ColumnRun] = []
    for (column, part), prompts in mine.items():
        freeze = None if prompts[0].id == first.id and "draft_calls" in part else first
        sub = replace(spec, prompts=prompts, columns=[column], parts=part, freeze_prompt=freeze)
        runs += run_draft_parity(sub, progress).columns.values()
    return merge(spec, [r for rank in all_gather(runs) for r in rank])


def merge(spec: DraftSpec, runs: list[ColumnRun]) -> DraftParityResult:
    """One result from the units' column runs (``runs``, in rank order): per column, rows, speculations
    and greedy runs in prompt order, pairs in ``PAIRS`` order, audit tallies summed."""
    from ..distributed import _merge_audit

    order = {p.id: i for i, p in enumerate(spec.prompts)}
    columns: dict[str, ColumnRun] = {}
    for name in spec.columns:
        cs = [r for r in runs if r.name == name]
        base = cs[0]
        if not base.ran:
            columns[name] = base
            continue
        col = ColumnRun(name, base.anchor, base.test, True, base.reason)
        col.rows = sorted((r for c in cs for r in c.rows), key=lambda r: order[r["prompt"]])   # stable
        for attr, keys in (("spec", PAIRS), ("greedy", ("anchor", "test"))):
            merged: dict[str, dict[str, Any]] = {}
            for c in cs:
                for key, per_prompt in getattr(c, attr).items():
                    merged.setdefault(key, {}).update(per_prompt)
            setattr(col, attr, {k: dict(sorted(merged[k].items(), key=lambda kv: order[kv[0]]))
                                for k in keys if k in merged})
        # the first violation one process would meet: the earliest prompt's, in the first part there
        first = [(order.get((c.audit.get("first") or {}).get("prompt_id"), len(order)), PARTS.index(c.parts[0]))
                 for c in cs]
        audits = [c.audit for _, c in sorted(zip(first, cs), key=lambda x: x[0]) if c.audit]
        col.audit = _merge_audit(audits) if audits else {}
        col.weight_audit = base.weight_audit       # one model: every unit's weight audit is the same
        columns[name] = col
    return DraftParityResult(spec, columns)
