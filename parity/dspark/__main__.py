"""``python -m parity.dspark``: DSpark draft parity on a 0731-style checkpoint (docs/dspark.md).

For the logic and floor columns (and the bug-budget column when a kernel backend runs): one draft
call per prompt compared probe by probe (join, rings, each stage, head) and row by row (draft logits
before/after the Markov correction, confidence), then greedy speculation for the reference and native
pairs and the crossed ones (reference target + native draft, native target + reference draft), with
losslessness checked against plain greedy decoding. Every check prints its bound and the bound's origin.

``python -m parity.dspark calibrate`` writes the floor rules of a checkpoint; ``acceptance --counts FILE``
judges an engine's acceptance counts (within the NVFP4 τ band or a bug); ``acceptance-dump`` writes
such a file from our native model.
Exit codes: 0 every judged check passes, 1 a check failed, 2 bad input, 3 tool failure."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

DEFAULT_CHECKPOINT = "tiny-trained-dspark"
CALIBRATION_SET = "prompts_calibration.toml"


def _common(p: argparse.ArgumentParser, subcommand: bool = False) -> None:
    # On a subcommand the defaults are suppressed: argparse would otherwise overwrite an option given
    # before the subcommand (``--checkpoint X calibrate``) with the subcommand's default.
    d = (lambda v: argparse.SUPPRESS) if subcommand else (lambda v: v)
    p.add_argument("--checkpoint", default=d(DEFAULT_CHECKPOINT),
                   help=f"a DSpark checkpoint directory or preset (default {DEFAULT_CHECKPOINT}: the trained tiny "
                        f"target with its trained three-stage draft; tiny-dspark: random weights)")
    p.add_argument("--seed", type=int, default=d(0), help="synthetic seed of a tiny preset")
    p.add_argument("--plan", default=d("default"), help="plan preset or TOML (its draft_* classes plan the draft)")
    p.add_argument("--device", default=d(None), help="cpu or cuda[:N] (default: best available)")
    p.add_argument("--threads", type=int, default=d(None), help="torch CPU threads")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.dspark", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    _common(p)
    p.add_argument("--mode", choices=("chat", "thinking"), default="chat")
    p.add_argument("--prompt", action="append", help="prompt id of the set or free text (repeatable)")
    p.add_argument("--prompt-set", default=None, help="a prompts TOML other than dsv4/data/prompts.toml")
    p.add_argument("--backend", default="auto", help="kernel backend of the bug-budget column (default auto)")
    p.add_argument("--profile", choices=("bf16", "official"), default="bf16", help="reference profile of the floor")
    p.add_argument("--columns", default="logic,floor,bug_budget", help="subset of logic,floor,bug_budget")
    p.add_argument("--act-scale", choices=("frozen", "static", "runtime"), default="frozen",
                   help="native activation global scales (default frozen: speculation needs batch-invariant scales)")
    p.add_argument("--tokens", type=int, default=32, help="tokens generated per prompt by each speculative pair")
    p.add_argument("--rules", default=None, help="floor rules TOML (default parity/thresholds/dspark/<checkpoint>.toml)")
    p.add_argument("--json", default=None, help="write a JSON summary here")
    z = sub.add_parser("zoo", help="every DSpark fault of the bug zoo through draft parity (caught, localized, cost)")
    _common(z, subcommand=True)
    S = argparse.SUPPRESS   # the parent's value stands unless given after the subcommand (see _common)
    z.add_argument("--mode", choices=("chat", "thinking"), default=S)
    z.add_argument("--prompt", action="append", default=S, help="prompt id of the set or free text (repeatable)")
    z.add_argument("--prompt-set", default=S, help="a prompts TOML other than dsv4/data/prompts.toml")
    z.add_argument("--fault", action="append", help="a DSpark fault name (repeatable; default all)")
    z.add_argument("--tokens", type=int, default=S, help="tokens per prompt of each speculative pair (default 32)")
    z.add_argument("--rules", default=S, help="floor rules TOML")
    a = sub.add_parser("acceptance", help="judge an engine's acceptance counts against the reference on the same "
                                          "steps: within the NVFP4 τ band or a bug (docs/dspark.md)")
    _common(a, subcommand=True)
    a.add_argument("--counts", required=True, metavar="FILE", help="the engine's counts file (JSONL, docs/dspark.md)")
    a.add_argument("--json", default=None, help="write the verdict as JSON here")
    d = sub.add_parser("acceptance-dump", help="write a counts file from our native model (optionally with a DSpark fault)")
    _common(d, subcommand=True)
    d.add_argument("--out", required=True, help="the counts file to write (draft logits beside it)")
    d.add_argument("--k", type=int, default=None, help="num_speculative_tokens (default: dspark_block_size)")
    d.add_argument("--precision", choices=("nvfp4", "fp32"), default="nvfp4",
                   help="nvfp4: plan default; fp32: the all-fp32 plan (judged exactly)")
    d.add_argument("--fault", default=None, help="a DSpark fault of the bug zoo patched into the draft")
    d.add_argument("--mode", choices=("chat", "thinking"), default=S)
    d.add_argument("--prompt", action="append", default=S, help="prompt id of the set or free text (repeatable)")
    d.add_argument("--tokens", type=int, default=S, help="tokens per prompt (default 32)")
    d.add_argument("--no-logits", action="store_true", help="leave the draft logits out")
    c = sub.add_parser("calibrate", help="write the floor rules of a checkpoint from the calibration prompts")
    _common(c, subcommand=True)
    c.add_argument("--prompt-set", default=S, help=f"calibration prompt set (default {CALIBRATION_SET})")
    c.add_argument("--out", default=None, help="default parity/thresholds/dspark/<checkpoint>.toml")
    c.add_argument("--envelope", default=None, metavar="FILE",
                   help="write the looser of each rule of FILE (another machine type's calibration) and this one")
    return p


def _progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _source(args: Any, device: str) -> Any:
    from ..cli import set_threads
    from ..source import resolve_checkpoint

    src = resolve_checkpoint(args.checkpoint, args.seed)
    set_threads(args.threads, device, src.config)
    return src


def main(argv: Sequence[str] | None = None, console: Any = None) -> int:
    args = build_parser().parse_args(argv)
    from ..cli import EXIT_FAIL, EXIT_PASS, outputs_of, parse_device, resolve_run_plan, run_cli

    def run(console: Any) -> int:
        from ..errors import ParityInputError
        from ..inputs import encode_prompts, select_prompts
        from ..records import atomic_write_json, json_safe
        from .judge import judge
        from .report import render, summary
        from .run import COLUMNS, DraftSpec

        from ..distributed import init, quiet_console
        from .sharded import run_draft_parity_sharded

        # under torchrun the prompts spread over the ranks, several ranks per GPU allowed (sharded.py)
        world, device = init(parse_device(args.device), shared_gpus=True)
        if not world.main:
            console = quiet_console()
        plan = resolve_run_plan(args.plan, args.checkpoint)
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
        if not columns or any(c not in COLUMNS for c in columns):
            raise ParityInputError(f"--columns: expected a subset of {list(COLUMNS)}, found {args.columns!r}")
        if args.tokens < 1:
            raise ParityInputError(f"--tokens: expected a positive int, found {args.tokens}")
        src = _source(args, device)
        prompts = encode_prompts(select_prompts(args.mode, args.prompt, args.prompt_set), src.tokenizer,
                                 src.config.vocab_size)
        spec = DraftSpec(source=src, prompts=prompts, plan=plan, profile=args.profile, backend=args.backend,
                         device=device, n_tokens=args.tokens, columns=columns, act_scale=args.act_scale)
        result = run_draft_parity_sharded(spec, _progress if world.main else None)
        verdict = judge(result, args.rules)
        console.print(f"checkpoint {src.spec} ({src.config_name}, fingerprint {src.fingerprint[:12]}), plan "
                      f"{plan.name}, reference profile {args.profile}, {len(prompts)} {args.mode} prompts, "
                      f"{args.tokens} tokens each")
        render(console, result, verdict)
        if args.json and world.main:
            atomic_write_json(args.json, json_safe(summary(result, verdict)))
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    def calibrate(console: Any) -> int:
        from pathlib import Path

        from ..env import code_version
        from dsv4.prompts import shipped_prompt_set

        from ..env import cpu_name
        from ..inputs import encode_prompts, select_prompts
        from .calibrate import MARGIN, ROW_MARGIN, calibrate as run_calibration, envelope, to_toml
        from .judge import rules_name, rules_path

        device = parse_device(args.device)
        plan = resolve_run_plan(args.plan, args.checkpoint)
        src = _source(args, device)
        prompt_set = shipped_prompt_set(args.prompt_set or CALIBRATION_SET)
        prompts = [p for mode in ("chat", "thinking")
                   for p in encode_prompts(select_prompts(mode, None, prompt_set), src.tokenizer,
                                           src.config.vocab_size)]
        import torch

        from .run import DraftSpec

        previous = None
        if args.envelope:   # a bad file: one error before any run
            from ..errors import ParityInputError
            from .judge import load_floor_rules

            try:
                previous, prev_plan = load_floor_rules("", args.envelope)
            except (ParityInputError, OSError, ValueError) as e:   # tomllib's errors are ValueErrors
                raise ParityInputError(f"--envelope: expected a draft floor rules TOML at {args.envelope}, "
                                       f"found {type(e).__name__}: {e}") from None
            if prev_plan != f"{plan.name}/{DraftSpec.act_scale}":
                raise ParityInputError(f"--envelope: expected rules of plan {plan.name}/{DraftSpec.act_scale}, "
                                       f"found {prev_plan or 'no plan'} in {args.envelope}")
        rules = run_calibration(src, prompts, plan, device, _progress)
        if previous is not None:
            rules = envelope(rules, previous, f"this machine ({cpu_name()})")
        out = Path(args.out) if args.out else rules_path(rules_name(src))
        header = (f"DSpark draft-parity floor rules for {src.spec} (fingerprint {src.fingerprint[:12]}), plan "
                  f"{plan.name}.\nWritten by `python -m parity.dspark calibrate` at {code_version()} from "
                  f"{len(prompts)} prompts of {prompt_set.name} (chat and thinking), reference profiles "
                  f"bf16 and official, compare modes propagated and isolated.\nMargins: errors x{MARGIN:g} "
                  f"(per-row maxima x{ROW_MARGIN:g}), "
                  f"cosine 1 - {MARGIN:g}(1 - worst), rates mean - 3 two-sample SE (at the judged count) - 0.02 (parity/dspark/calibrate.py);\n"
                  f"top-1 agreement without rows whose anchor top-2 margin is below {DraftSpec.floor_near_tie:g} "
                  f"nats (the trunk floor's near_tie_logprob). Torch threads: {torch.get_num_threads()} "
                  f"(the summation order of the BF16 sides)."
                  + (f"\nEach rule is the looser of {Path(args.envelope).name} as it was (earlier machine types) and this "
                     f"calibration on {cpu_name()}; `calibrated` lists every machine type's bound "
                     f"(parity/dspark/calibrate.py)."
                     if previous is not None else ""))

        out.write_text(to_toml(rules, header, plan.name, DraftSpec.act_scale), encoding="utf-8")
        console.print(f"wrote {len(rules)} rules to {out}")
        return EXIT_PASS

    def zoo(console: Any) -> int:
        from ..bugzoo.draft_zoo import DSPARK_FAULTS
        from ..errors import ParityInputError
        from ..inputs import encode_prompts, select_prompts
        from .run import DraftSpec
        from .zoo import render_zoo, run_zoo

        bad = [f for f in (args.fault or []) if f not in DSPARK_FAULTS]
        if bad:
            raise ParityInputError(f"--fault: expected DSpark faults {sorted(DSPARK_FAULTS)}, found {bad}")
        device = parse_device(args.device)
        plan = resolve_run_plan(args.plan, args.checkpoint)
        src = _source(args, device)
        prompts = encode_prompts(select_prompts(args.mode, args.prompt, args.prompt_set), src.tokenizer,
                                 src.config.vocab_size)
        spec = DraftSpec(source=src, prompts=prompts, plan=plan, device=device, n_tokens=args.tokens)
        clean, rows = run_zoo(spec, args.fault, _progress, args.rules)
        render_zoo(console, clean, rows)
        return EXIT_PASS if clean.localized and all(r.ok for r in rows) else EXIT_FAIL

    def acceptance(console: Any) -> int:
        from ..records import atomic_write_json, json_safe
        from .acceptance import judge_acceptance, read_dump, render

        dump = read_dump(args.counts)
        device = parse_device(args.device)
        _source(args, device)      # threads, and a bad checkpoint is one error before any replay
        verdict = judge_acceptance(dump, args.checkpoint, device=device, progress=_progress)
        render(console, dump, verdict)
        if args.json:
            atomic_write_json(args.json, json_safe(verdict.to_dict()))
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    def acceptance_dump(console: Any) -> int:
        from ..bugzoo.draft_zoo import DSPARK_FAULTS
        from ..errors import ParityInputError
        from ..inputs import encode_prompts, select_prompts
        from .acceptance_dump import dump_native

        if args.fault and args.fault not in DSPARK_FAULTS:
            raise ParityInputError(f"--fault: expected a DSpark fault {sorted(DSPARK_FAULTS)}, found {args.fault!r}")
        src = _source(args, parse_device(args.device))
        k = args.k or src.config.dspark_block_size
        if not 1 <= k <= src.config.dspark_block_size:
            raise ParityInputError(f"--k: expected 1..{src.config.dspark_block_size} (dspark_block_size), found {k}")
        prompts = encode_prompts(select_prompts(args.mode, args.prompt, None), src.tokenizer, src.config.vocab_size)
        out = dump_native(args.checkpoint, args.out, prompts=prompts, k=k, n_tokens=args.tokens,
                          precision=args.precision, fault=args.fault, with_logits=not args.no_logits,
                          device=parse_device(args.device))
        console.print(f"wrote {out}")
        return EXIT_PASS

    body = {"calibrate": calibrate, "zoo": zoo, "acceptance": acceptance,
            "acceptance-dump": acceptance_dump}.get(args.command, run)
    kinds = {"out": "file"} if args.command in ("calibrate", "acceptance-dump") else {}
    return run_cli(body, console, outputs_of(args, **kinds))


if __name__ == "__main__":
    sys.exit(main())
