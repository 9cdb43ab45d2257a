"""``python -m parity.bugzoo``: prove the harness — inject each fault into the native model and check
that the default thresholds catch it in its column and that the first divergence points at it.

Runs on the tiny checkpoint of seed 0 and the hold-out prompt set (dsv4/data/prompts_holdout.toml):
neither was used to calibrate the thresholds (tiny seeds 1-3, standard prompts). A clean row (no
fault) must raise no alarm on the same prompts.

Exit codes: 0 every fault caught in its column and localized, clean row quiet; 1 otherwise;
2 bad input (unknown fault, unimportable --faults-module, bad checkpoint or prompts); 3 a row could
not be measured (marked ``error`` with its message; every other row is kept and written).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from dsv4.checkpoint.builtin import add_checkpoint_argument

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from ..runner import ModelLoaders



from ..cli import (EXIT_FAIL, EXIT_PASS, EXIT_TOOL_FAILED, outputs_of, parse_device, progress_bars, run_cli,
                   set_threads)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.bugzoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--fault", action="append", metavar="NAME", help="run only this fault (repeatable)")
    p.add_argument("--list", action="store_true", help="list the registered faults and exit")
    p.add_argument("--faults-module", action="append", metavar="M", default=[],
                   help="import this module (dotted name or .py file) and run only its faults (with "
                        "--with-builtins, the built-in ones too)")
    p.add_argument("--with-builtins", action="store_true", help="with --faults-module: also run the built-in faults")
    p.add_argument("--clean-only", action="store_true", help="run only the clean row (no fault: must raise no alarm)")
    p.add_argument("--records", default=None, help="write every measurement as JSONL here (field 'fault' set)")
    p.add_argument("--json", default=None, help="write the zoo summary (schema parity.bugzoo/1) here")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows of an earlier --json summary (and their --records) measured in the same "
                        "context; measure only the missing or failed-to-run ones")
    add_checkpoint_argument(p)
    p.add_argument("--seed", type=int, default=0, help="synthetic seed of a tiny preset (default 0: held out)")
    p.add_argument("--prompt-set", default=None, help="prompts TOML (default: the hold-out set)")
    p.add_argument("--rules", default=None, help="thresholds TOML (default: parity/thresholds/default.toml)")
    p.add_argument("--plan", default="default", help="plan of the floor / bug-budget columns (default: default)")
    p.add_argument("--profile", choices=("bf16", "official"), default="bf16")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: best available)")
    p.add_argument("--backend", default="auto",
                   help="kernel backend of the clean row's bug-budget column (default auto; on a device with "
                        "none, a clean copy of emulated stands in)")
    p.add_argument("--reference-cache", default=None, help="store / reuse reference runs in this directory")
    p.add_argument("--no-clean", action="store_true", help="skip the clean row")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for tiny on cpu)")
    return p


def main(argv: Sequence[str] | None = None, *, loaders: ModelLoaders | None = None,
         console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body(console: Console) -> int:
        from dsv4.plan import resolve_plan
        from dsv4.prompts import PromptSetError
        from ..errors import ParityInputError, PromptError
        from ..records import atomic_write_json, write_records
        from ..rules import load_rules
        from ..source import resolve_checkpoint
        from .registry import get_fault, list_faults, load_faults_module
        from .render import fault_list, footer, header, zoo_table
        from .runner import ZooSpec, holdout_prompt_path, load_holdout, run_zoo

        user = [f for m in args.faults_module for f in load_faults_module(m)]
        if args.list:
            fault_list(console, list_faults())
            return EXIT_PASS
        if args.clean_only and (args.fault or args.no_clean):
            raise ParityInputError("--clean-only: expected without --fault / --no-clean, found both")
        if args.fault:
            faults = [get_fault(n) for n in args.fault]
        elif args.clean_only:
            faults = []
        elif args.faults_module and not args.with_builtins:
            faults = user     # a user's faults module runs its own faults, not the whole zoo again
        else:
            faults = list_faults()
        plan = resolve_plan(args.plan)
        device = parse_device(args.device)
        rules = load_rules(args.rules, args.checkpoint)
        src = resolve_checkpoint(args.checkpoint, args.seed)
        set_threads(args.threads, device, src.config)
        prompt_set = args.prompt_set or str(holdout_prompt_path())
        try:
            prompts = load_holdout(src, prompt_set)
        except PromptSetError as e:
            raise PromptError(str(e)) from None
        spec = ZooSpec(source=src, prompts=prompts, rules=rules, prompt_set=prompt_set, plan=plan,
                       profile=args.profile, device=device, backend=args.backend,
                       reference_cache=Path(args.reference_cache) if args.reference_cache else None,
                       clean=not args.no_clean)
        reused: dict = {}
        if args.resume and not args.json:
            raise ParityInputError("--resume: expected --json FILE (the summary to resume from), found none")
        if args.resume:
            from .resume import previous_rows
            from .runner import ZooResult

            reused, why = previous_rows(args.json, ZooResult(spec, [], [], 0.0).summary())
            console.print(why)
        todo = [f for f in faults if f.name not in reused]
        run_spec = dataclasses.replace(spec, clean=spec.clean and None not in reused)
        with progress_bars(console) as progress:
            result = run_zoo(run_spec, todo, loaders=loaders, progress=progress, clean_faults=faults)
        summary, records = result.summary(), result.records
        if reused:
            from .resume import merged_summary, previous_records

            order = ([None] if spec.clean else []) + [f.name for f in faults]
            summary = merged_summary(summary, {k: v for k, v in reused.items() if k in order}, order)
            records = previous_records(args.records, {k for k in reused if k in order}
                                       - {r.fault.name if r.fault else None for r in result.rows}) + records
        if args.records:
            write_records(args.records, records)
        header(console, summary)
        zoo_table(console, summary)
        footer(console, summary)
        if args.json:
            atomic_write_json(args.json, summary)
        if any(r.get("error") for r in summary["rows"]):   # rows measured so far are kept above; this run is incomplete
            return EXIT_TOOL_FAILED
        return EXIT_PASS if summary["passed"] else EXIT_FAIL

    return run_cli(body, console, outputs_of(args))


if __name__ == "__main__":
    sys.exit(main())
