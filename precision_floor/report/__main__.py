"""``python -m precision_floor.report --out reports/NAME.html [--records DIR]``

With ``--records DIR``: render the store DIR (no model runs). Without it: run the flip tables, the
floor search and the floor plan's column run on ``--checkpoint`` (default: the built-in tiny model)
into its default store, reusing every evaluation already there, then render it.

Exit codes: 0 written, 2 bad input (e.g. a store without study summaries).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..cache import EvalStore



def build_parser() -> argparse.ArgumentParser:
    from ..search import DEFAULT_BUDGET_KL, DEFAULT_BUDGET_TOP1

    from ..cli import add_common

    p = argparse.ArgumentParser(prog="python -m precision_floor.report", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the HTML file to write")
    add_common(p)
    p.add_argument("--zoo-summary", default=None, help="bug-zoo JSON summary (default: DIR/bugzoo-summary.json)")
    p.add_argument("--zoo-records", default=None, help="bug-zoo records JSONL (default: DIR/bugzoo-records.jsonl)")
    p.add_argument("--budget-kl", type=float, default=DEFAULT_BUDGET_KL, help="floor-search budget when running")
    p.add_argument("--budget-top1", type=float, default=DEFAULT_BUDGET_TOP1)
    p.add_argument("--title", default=None)
    return p


def write_atomic(path: Path, text: str) -> None:
    """A reader never sees half a report (dsv4.atomic_io)."""
    from dsv4.atomic_io import atomic_write_text

    atomic_write_text(path, text)


def run_studies(args: argparse.Namespace, console) -> EvalStore:
    """Flips, search, column run and reference presets into the checkpoint's default store (resumed)."""
    from dsv4.plan import PrecisionPlan

    from ..cli import open_session
    from ..flips import DIRECTIONS, run_flips
    from ..evaluate import FLIP_CLASSES
    from ..search import REFERENCE_PLANS, Budget, column_run, floor_search

    session = open_session(args, console, reuse=True)
    ev = session.evaluator
    tables = run_flips(ev)
    session.store.write_json("flips", {**session.header(), "classes": list(FLIP_CLASSES),
                                       "directions": list(DIRECTIONS), **tables.to_json()})
    result = floor_search(ev, Budget(args.budget_kl, args.budget_top1))
    column_run(ev, result.floor)
    for name in REFERENCE_PLANS:
        ev.score(PrecisionPlan.preset(name))
    session.store.write_json("search", {**session.header(), "classes": list(FLIP_CLASSES), **result.to_json()})
    session.finish(console)
    return session.store


def main(argv: Sequence[str] | None = None) -> int:
    from ..cli import run_tool

    args = build_parser().parse_args(argv)

    def body(console) -> int:
        from ..cache import EvalStore
        from ..errors import FloorInputError
        from .build import render_report

        if args.records:
            store = EvalStore(Path(args.records))
            if not store.root.is_dir():
                raise FloorInputError(f"--records: expected an evaluation store directory, found nothing at "
                                      f"{args.records}")
        else:
            store = run_studies(args, console)
        kw = {"title": args.title} if args.title else {}
        html = render_report(store, zoo_summary=Path(args.zoo_summary) if args.zoo_summary else None,
                             zoo_records=Path(args.zoo_records) if args.zoo_records else None, **kw)
        write_atomic(Path(args.out), html)
        console.print(f"wrote {args.out} ({len(html.encode()) / 1024:.0f} KiB) from {store.root}")
        return 0

    return run_tool(body, args, out="file", records="")


if __name__ == "__main__":
    sys.exit(main())
