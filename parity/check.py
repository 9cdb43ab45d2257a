"""``python -m parity.check RECORDS... --rules FILE``: re-judge stored records without re-running.

Prints, per pair, pass/fail and the first divergence, and for each failing rule the threshold value
at which it would have passed. Records must come from one checkpoint and, per pair, one plan
(mixing them would judge unrelated measurements together): otherwise exit 2, like malformed JSONL
or TOML and rules naming unknown probes or metrics. Exit 0 pass, 1 a threshold failure.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import Console


from .cli import EXIT_FAIL, EXIT_PASS, outputs_of, run_cli


def check_consistent(df: pd.DataFrame) -> None:
    """One checkpoint overall; one plan and one reference profile per pair."""
    from .errors import RecordsError

    fps = sorted(df["checkpoint_fingerprint"].unique())
    if len(fps) > 1:
        raise RecordsError(f"records: expected one checkpoint, found {len(fps)} fingerprints "
                           f"{[f[:12] for f in fps]}; check each checkpoint's records separately")
    for pair, g in df.groupby("pair"):
        for col in ("plan", "profile"):
            vals = sorted(g[col].unique())
            if len(vals) > 1:
                raise RecordsError(f"records: pair {pair!r}: expected one {col}, found {vals}; check each "
                                   f"{col}'s records separately")


def main(argv: Sequence[str] | None = None, *, console: Console | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m parity.check", description=__doc__.split("\n\n")[0])
    p.add_argument("records", nargs="+", help="JSONL record files")
    p.add_argument("--rules", default=None, help="thresholds TOML (default: parity/thresholds/default.toml)")
    p.add_argument("--json", default=None, help="write the verdict as JSON here")
    args = p.parse_args(argv)

    def body(console: Console) -> int:
        from rich.table import Table
        from .records import atomic_write_json, read_records
        from .render import rules_report
        from .rules import load_rules
        from .verdict import evaluate

        df = read_records(args.records)
        check_consistent(df)
        rules = load_rules(args.rules, str(df["config_name"].iloc[0]))   # the records' model's own rules
        verdict = evaluate(df, rules)
        t = Table(title=f"{len(df)} records, {df['run_id'].nunique()} run(s), checkpoint "
                        f"{df['checkpoint_fingerprint'].iloc[0][:12]}", title_justify="left")
        for c in ("pair", "plan", "profile", "status", "first divergence (isolated)"):
            t.add_column(c)
        for pair in verdict.pairs:
            g = df[df["pair"] == pair]
            ok = verdict.pair_passed(pair)
            d = verdict.first_divergence[pair]
            status = ("pass" if ok else "FAIL") + (" (not a floor: logic fails)"
                                                   if pair == "floor" and not verdict.floor_is_floor else "")
            t.add_row(pair, g["plan"].iloc[0], g["profile"].iloc[0], status, d.describe() if d else "none")
        console.print(t)
        rules_report(console, verdict, rules)
        if args.json:
            atomic_write_json(args.json, verdict.summary())
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    return run_cli(body, console, outputs_of(args, records=""))   # records: the input files here


if __name__ == "__main__":
    sys.exit(main())
