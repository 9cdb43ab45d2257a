"""The tables of a draft-parity run (rows as a DataFrame, the acceptance table) and its rendering:
rich tables that fold instead of truncating, plain text through a pipe."""
from __future__ import annotations

from typing import Any

from .judge import DraftVerdict
from .run import PAIRS, DraftParityResult


def acceptance_table(result: DraftParityResult) -> list[dict[str, Any]]:
    """Per column and pair (target+draft): sides, steps, mean τ, and the per-position acceptance rate."""
    gamma = result.spec.source.config.dspark_block_size
    out = []
    for col, run in result.columns.items():
        labels = {"anchor": run.anchor, "test": run.test}
        for pair in PAIRS:
            runs = list(run.spec.get(pair, {}).values())
            if not runs:
                continue
            acc = [a for r in runs for a in r.accepted]
            tgt, drf = pair.split("+")
            out.append({"column": col, "pair": pair, "target": labels[tgt], "draft": labels[drf], "steps": len(acc),
                        "tau": sum(a + 1 for a in acc) / len(acc) if acc else float("nan"),
                        "position_rates": [sum(a >= j for a in acc) / len(acc) if acc else float("nan")
                                           for j in range(1, gamma + 1)]})
    return out


def summary(result: DraftParityResult, verdict: DraftVerdict) -> dict[str, Any]:
    spec = result.spec
    return {
        "checkpoint": {"spec": spec.source.spec, "config": spec.source.config_name, "fingerprint": spec.source.fingerprint},
        "plan": spec.plan.to_dict(), "profile": spec.profile, "n_tokens": spec.n_tokens, "near_tie": spec.near_tie,
        "prompts": [p.id for p in spec.prompts],
        "columns": {c: {"ran": r.ran, "reason": r.reason, "anchor": r.anchor, "test": r.test,
                        "audit": r.audit, "weight_audit": r.weight_audit} for c, r in result.columns.items()},
        "acceptance": acceptance_table(result),
        "verdict": {"passed": verdict.passed, "unjudged": verdict.unjudged, "first_divergence": verdict.first_divergence,
                    "checks": len(verdict.checks),
                    "failures": [c.__dict__ for c in verdict.failures]},
    }


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def render(console: Any, result: DraftParityResult, verdict: DraftVerdict, max_failures: int = 20) -> None:
    from rich.table import Table

    t = Table(title="DSpark acceptance (greedy; τ = accepted drafts + 1 per verify step)", show_lines=False)
    for name in ("column", "target", "draft", "steps", "mean τ", "accept rate by draft position"):
        t.add_column(name, overflow="fold")
    for row in acceptance_table(result):
        t.add_row(row["column"], row["target"], row["draft"], str(row["steps"]), f"{row['tau']:.3f}",
                  " ".join(f"{x:.2f}" for x in row["position_rates"]))
    console.print(t)
    by_col: dict[str, list[int]] = {}
    for c in verdict.checks:
        by_col.setdefault(c.column, [0, 0])[0 if c.passed else 1] += 1
    t = Table(title="Checks by column")
    for name in ("column", "pair", "passed", "failed"):
        t.add_column(name, overflow="fold")
    for col, (ok, bad) in by_col.items():
        run = result.columns[col]
        t.add_row(col, f"{run.anchor} <-> {run.test}", str(ok), str(bad))
    console.print(t)
    if verdict.failures:
        t = Table(title=f"Failed checks (first {min(max_failures, len(verdict.failures))} of {len(verdict.failures)})")
        for name in ("column", "check", "where", "place", "component", "value", "bound", "bound's origin"):
            t.add_column(name, overflow="fold")
        for c in verdict.failures[:max_failures]:
            t.add_row(c.column, c.check, c.where, c.place, c.component, _fmt(c.value), _fmt(c.bound), c.origin)
        console.print(t)
    for col, modes in verdict.first_divergence.items():
        for mode, where in modes.items():
            console.print(f"first divergence, {col} column, {mode}: {where}")
    for u in verdict.unjudged:
        console.print(f"not judged: {u}")
    console.print(f"DSpark draft parity: {'PASS' if verdict.passed else 'FAIL'} ({len(verdict.checks)} checks, "
                  f"{len(verdict.failures)} failed{', some columns not judged' if verdict.unjudged else ''})")
