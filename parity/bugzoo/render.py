"""Rich rendering of the bug zoo (the CLI calls these; nothing here runs a model).

Everything renders from the JSON summary (``ZooResult.summary()``), so a stored summary re-renders
the same table.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..numbers import sig
from .registry import Fault


def ratio_text(ratio: Any) -> str:
    if ratio is None:
        return "exact"
    if isinstance(ratio, str):          # "inf" / "nan" in a JSON summary
        return f"x{ratio}"
    return f"x{ratio:.3g}"


_FAILS_AS = {"<=": ">", "<": ">=", ">=": "<", ">": "<=", "==": "!="}


def judgement_text(j: Mapping[str, Any] | None) -> str:
    """``metric value (fails-as) threshold`` over the probe it was measured on."""
    if not j:
        return "—"
    return (f"{j['metric']} {sig(_num(j['value']), 4)} {_FAILS_AS[j['op']]} {sig(_num(j['threshold']), 4)}"
            f"\n[dim]{escape(j['probe'])}[/dim]")


def divergence_text(d: Mapping[str, Any] | None) -> str:
    """The probe, then (dimmed) its layer, component class and the metric that crossed there."""
    if not d:
        return "none"
    where = "global" if d["layer"] is None else f"L{d['layer']}"
    return (f"{escape(d['probe'])}\n[dim]{where} {escape(d['component'])}: {d['metric']} "
            f"{ratio_text(d['ratio'])}[/dim]")


def _num(v: Any) -> float:
    return float(v)     # a JSON summary writes non-finite numbers as "inf" / "nan": float() reads both


def column_text(r: Mapping[str, Any]) -> str:
    """``expected -> alarmed`` and, dimmed, where the first divergence must point."""
    e = r["expected"]
    alarmed = ", ".join(r["columns_alarmed"]) or "none"
    if r["error"]:
        alarmed = f"[red]error[/red]: {escape(r['error'])}"
    if not e:
        return f"none -> {alarmed}"
    where = "global" if e["layer"] is None else f"L{e['layer']}"
    return f"{e['column']} -> {alarmed}\n[dim]at {where} {'/'.join(e['localization'])}[/dim]"


def zoo_table(console: Console, summary: Mapping[str, Any]) -> None:
    t = Table(title="bug zoo (thresholds unchanged): caught in its column? first divergence at the fault?",
              title_justify="left", show_lines=True)
    t.add_column("fault", overflow="fold", min_width=14)
    t.add_column("column: expected -> alarmed", overflow="fold")
    t.add_column("caught by (strongest failure)", overflow="fold")
    t.add_column("ratio", justify="right")
    t.add_column("first divergence (isolated)", overflow="fold")
    t.add_column("loc.", justify="center")
    t.add_column("result", justify="center")
    for r in summary["rows"]:
        name = r["fault"] or "[bold]clean[/bold]"
        loc = "—" if r["localized"] is None else ("yes" if r["localized"] else "[red]no[/red]")
        ok = "[green]PASS[/green]" if r["passed"] else "[red]FAIL[/red]"
        cb = r["caught_by"]
        t.add_row(name, column_text(r), judgement_text(cb),
                  ratio_text(cb["ratio"]) if cb else "—", divergence_text(r["first_divergence"]), loc, ok)
    console.print(t)


def header(console: Console, summary: Mapping[str, Any]) -> None:
    ck, ho = summary["checkpoint"], summary["held_out"]
    lines = [f"checkpoint {escape(ck['spec'])} ({ck['config']}, seed {ck['seed']}, "
             f"fingerprint {ck['fingerprint'][:12]})",
             f"plan {summary['plan']['name']}, reference profile {summary['profile']}, device {summary['device']}",
             f"prompts {escape(summary['prompt_set'])}: {len(summary['prompts'])} "
             f"({', '.join(sorted({p['mode'] for p in summary['prompts']}))})",
             f"rules {escape(summary['rules']['source'])} ({summary['rules']['count']} rules, unchanged)"]
    console.print("\n".join(lines))
    if not (ho["seed"] and ho["prompts"]):
        why = []
        if not ho["seed"]:
            why.append(f"seed {ck['seed']} is a calibration seed {ho['calibration_seeds']}")
        if ho["shared_prompt_ids"]:
            why.append(f"prompts shared with the calibration set: {', '.join(ho['shared_prompt_ids'])}")
        console.print(f"[yellow]warning:[/yellow] not a hold-out run: {'; '.join(why)}")


def footer(console: Console, summary: Mapping[str, Any]) -> None:
    rows = [r for r in summary["rows"] if r["fault"]]
    caught = sum(r["caught"] and r["column_ok"] for r in rows)
    localized = sum(bool(r["localized"]) for r in rows)
    clean = [r for r in summary["rows"] if r["fault"] is None]
    clean_txt = ("clean row quiet" if clean[0]["passed"] else "[red]clean row raised an alarm[/red]") if clean \
        else "clean row not run"
    verdict = "[green]PASS[/green]" if summary["passed"] else "[red]FAIL[/red]"
    console.print(f"{caught}/{len(rows)} faults caught in their column, {localized}/{len(rows)} localized; "
                  f"{clean_txt}; wall {summary['wall_seconds']:.1f} s  {verdict}")


def fault_list(console: Console, faults: Sequence[Fault]) -> None:
    t = Table(title="registered faults", title_justify="left", show_lines=True)
    for col in ("fault", "column", "layer", "localizes as", "description", "module"):
        t.add_column(col)
    for f in faults:
        desc = escape(f.description) + (f"\n[dim]kernel backend: {f.backend.name}[/dim]" if f.backend else "")
        t.add_row(f.name, f.column, "global" if f.layer is None else str(f.layer), "/".join(f.localization),
                  desc, f.module)
    console.print(t)
