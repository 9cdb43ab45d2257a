"""``python -m parity.dspark zoo``: every DSpark fault of the bug zoo (parity.bugzoo.dspark_faults)
put through draft parity: caught (a failing check in the fault's column), localized (the first
divergence of that column names the fault's place and component, isolated mode first), the clean
row quiet, and what each fault costs in acceptance: the mean τ of the reference target with the
faulty native draft against the same pair with the clean native draft (same prompts, greedy)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from ..bugzoo.draft_zoo import DSPARK_FAULTS, DraftFault
from .judge import DraftVerdict, judge
from .report import acceptance_table
from .run import DraftSpec, run_draft_parity
from .sides import Side, native_side, reference_side


@dataclass
class ZooRow:
    fault: str
    column: str
    expected: str
    caught: bool
    localized: bool
    first_divergence: str
    failures: int
    tau_clean: float
    tau_faulty: float

    @property
    def ok(self) -> bool:
        return self.caught and self.localized


def _builder(fault: DraftFault | None) -> Callable[..., Side]:
    def build(kind: str, path: str, **kw: Any) -> Side:
        if kind == "reference":
            return reference_side(path, **kw)
        side = native_side(path, **kw)
        if fault is not None:
            # kept on the side (a dropped generator would close and undo the patch); the side is
            # discarded after its column, so the fault is never restored
            side.fault = fault(side.dspark)
            side.fault.__enter__()
        return side
    return build


def _crossed_tau(result: Any, column: str) -> float:
    """Mean τ of the anchor (reference) target with the test (native) draft."""
    for row in acceptance_table(result):
        if row["column"] == column and row["pair"] == "anchor+test":
            return row["tau"]
    return float("nan")


def _where(v: DraftVerdict, column: str) -> str:
    modes = v.first_divergence.get(column, {})
    return modes.get("isolated") or modes.get("propagated") or ""


def run_zoo(spec: DraftSpec, names: list[str] | None = None, progress: Callable[[str], None] | None = None,
            rules_file: Any = None) -> tuple[ZooRow, list[ZooRow]]:
    progress = progress or (lambda _m: None)
    faults = [DSPARK_FAULTS[n] for n in (names or list(DSPARK_FAULTS))]
    columns = sorted({f.column for f in faults}, key=("logic", "floor").index)
    clean_res = run_draft_parity(replace(spec, columns=tuple(columns), build_side=_builder(None)),
                                 lambda m: progress(f"clean: {m}"))
    cv = judge(clean_res, rules_file)
    clean = ZooRow("(clean)", ",".join(columns), "quiet", not cv.passed, cv.passed, _where(cv, columns[0]),
                   len(cv.failures), _crossed_tau(clean_res, columns[0]), _crossed_tau(clean_res, columns[0]))
    rows = []
    for f in faults:
        res = run_draft_parity(replace(spec, columns=(f.column,), build_side=_builder(f)),
                               lambda m, n=f.name: progress(f"{n}: {m}"))
        v = judge(res, rules_file)
        where = _where(v, f.column)
        caught = any(c.column == f.column for c in v.failures)
        localized = where.endswith(f"({f.place}, {f.component})")
        rows.append(ZooRow(f.name, f.column, f"{f.place}, {f.component}", caught, localized, where,
                           len(v.failures), _crossed_tau(clean_res, f.column), _crossed_tau(res, f.column)))
    return clean, rows


def render_zoo(console: Any, clean: ZooRow, rows: list[ZooRow]) -> None:
    from rich.table import Table

    t = Table(title="DSpark faults through draft parity (τ: reference target + native draft, greedy)")
    for name in ("fault", "column", "expected place", "caught", "first divergence", "failed checks",
                 "τ clean", "τ faulty", "Δτ"):
        t.add_column(name, overflow="fold")
    t.add_row(clean.fault, clean.column, "quiet", "no" if clean.localized else "ALARM", clean.first_divergence or "-",
              str(clean.failures), f"{clean.tau_clean:.3f}", "-", "-")
    for r in rows:
        t.add_row(r.fault, r.column, r.expected, "yes" if r.caught else "NO", r.first_divergence or "-",
                  str(r.failures), f"{r.tau_clean:.3f}", f"{r.tau_faulty:.3f}", f"{r.tau_faulty - r.tau_clean:+.3f}")
    console.print(t)
    ok = clean.localized and all(r.ok for r in rows)
    console.print(f"DSpark zoo: {sum(r.ok for r in rows)}/{len(rows)} caught and localized, clean row "
                  f"{'quiet' if clean.localized else 'NOT quiet'}: {'PASS' if ok else 'FAIL'}")
