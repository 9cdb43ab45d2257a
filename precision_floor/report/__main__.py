"""``python -m precision_floor.report --out reports/NAME.html [--records DIR] [--resume]``

Renders the evaluation store DIR (default: the checkpoint's store under the project cache; created
when absent). Every study the store lacks (flip tables, floor search, bug zoo) is first run into DIR
by its own command (precision_floor/report/studies.py), with this command's --checkpoint, --seed,
--mode, --prompt, --profile, --device, --threads and --resume: with --resume, evaluations already in
DIR are reused, without it each plan is computed once afresh, exactly as in flips / search / bugzoo.
Studies already in DIR are replayed from their records, not recomputed. The attribution study
(minutes per fault) runs only when --with-attribution asks for it; its section says how otherwise.

Exit codes: 0 written, 2 bad input (e.g. an unreadable store), 3 a study could not run.
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
    p.add_argument("--with-attribution", action="store_true",
                   help="also run the attribution study when the store lacks it (minutes per fault)")
    p.add_argument("--title", default=None)
    return p


def write_atomic(path: Path, text: str) -> None:
    """A reader never sees half a report (dsv4.atomic_io)."""
    from dsv4.atomic_io import atomic_write_text

    atomic_write_text(path, text)


def study_argv(args: argparse.Namespace, study: str, store: EvalStore) -> list[str]:
    """The study's own command line, with this run's choices forwarded (studies.STUDIES)."""
    from .studies import ZOO_RECORDS, ZOO_SUMMARY

    common = ["--checkpoint", args.checkpoint, "--seed", str(args.seed), "--profile", args.profile]
    common += ["--device", args.device] if args.device else []
    common += ["--threads", str(args.threads)] if args.threads else []
    if study == "bugzoo":   # the zoo's own prompts (the hold-out set), its own files in the store
        return common + ["--json", str(store.root / ZOO_SUMMARY), "--records", str(store.root / ZOO_RECORDS)]
    argv = common + ["--records", str(store.root), "--mode", args.mode]
    argv += [x for pid in (args.prompt or []) for x in ("--prompt", pid)]
    argv += ["--resume"] if args.resume else []
    if study == "search":
        argv += ["--budget-kl", repr(args.budget_kl), "--budget-top1", repr(args.budget_top1)]
    return argv


def estimate(store: EvalStore, study: str, n_classes: int) -> str:
    """Evaluations the study needs at most, times the store's mean seconds per evaluation so far."""
    n = {"flips": 2 + 2 * n_classes, "search": n_classes * (n_classes + 1) // 2 + n_classes + 4}.get(study)
    secs = [m.get("seconds") for m in store.manifests() if isinstance(m.get("seconds"), (int, float))]
    if n is None:
        return "one three-way run per fault; progress below"
    if not secs:
        return f"up to {n} evaluations; the first one sets the pace"
    return f"up to {n} evaluations, ~{n * sum(secs) / len(secs):.0f} s at this store's {sum(secs) / len(secs):.1f} s each"


def run_missing_studies(args: argparse.Namespace, store: EvalStore, console) -> list[str]:
    """Run each study the store lacks through its own CLI; returns the studies that could not run."""
    from ..constants import FLIP_CLASSES
    from ..errors import FloorInputError
    from .studies import STUDIES, study_main

    wanted = ["flips", "search"] + ([] if args.zoo_summary or args.zoo_records else ["bugzoo"])
    wanted += ["attribution"] if args.with_attribution else []
    failed = []
    for study in STUDIES:
        path = store.root / STUDIES[study][0]
        if path.exists():
            console.print(f"{study}: in the store ({path.name}), replayed from its records")
            continue
        if study not in wanted:
            console.print(f"{study}: not in the store; its section says how to run it ({STUDIES[study][1]})")
            continue
        console.print(f"{study}: not in the store, running {STUDIES[study][1].replace('DIR', str(store.root))} "
                      f"({estimate(store, study, len(FLIP_CLASSES))})")
        rc = study_main(study)(study_argv(args, study, store))
        if rc == 2:
            raise FloorInputError(f"{study}: its command rejected the input (above); no report written")
        if not path.exists():
            failed.append(study)
            console.print(f"{study}: could not run (exit {rc}); its section stays absent")
    return failed


def default_store(args: argparse.Namespace) -> Path:
    from parity.source import resolve_checkpoint

    from ..cli import default_records_dir

    return default_records_dir(resolve_checkpoint(args.checkpoint, args.seed))


def main(argv: Sequence[str] | None = None) -> int:
    from parity.cli import EXIT_TOOL_FAILED

    from ..cli import run_tool

    args = build_parser().parse_args(argv)

    def body(console) -> int:
        from ..cache import EvalStore
        from .build import render_report

        store = EvalStore(Path(args.records) if args.records else default_store(args))
        failed = run_missing_studies(args, store, console)
        kw = {"title": args.title} if args.title else {}
        html = render_report(store, zoo_summary=Path(args.zoo_summary) if args.zoo_summary else None,
                             zoo_records=Path(args.zoo_records) if args.zoo_records else None, **kw)
        write_atomic(Path(args.out), html)
        console.print(f"wrote {args.out} ({len(html.encode()) / 1024:.0f} KiB) from {store.root}")
        return EXIT_TOOL_FAILED if failed else 0

    return run_tool(body, args, out="file")


if __name__ == "__main__":
    sys.exit(main())
