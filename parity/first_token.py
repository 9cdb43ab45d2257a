"""``python -m parity.first_token --mode chat|thinking``: the three columns on the standard prompts.

For every prompt: the reference and native models' first-token logits (top-k table), the logits
statistics over all teacher-forced prompt positions (KL(reference || native) mean +- SE and
percentiles, top-1 agreement +- SE with near ties forgiven, top-k overlap, dp), the per-layer
cosine summary of the three columns (logic / floor / bug budget), selection agreement, and the
first divergence (the first probe whose *isolated* error exceeds its threshold).

In thinking mode the prompt already ends with ``<think>``: a low ``<think>`` logit at the first
position is expected, and no rule judges special-token logits, so it is never a failure.

Exit codes: 0 every rule passes, 1 a threshold failure, 2 bad input.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .cli import (EXIT_FAIL, EXIT_PASS, EXIT_TOOL_FAILED, add_run_arguments, outputs_of, parse_device, parse_device_map,
                  resolve_run_plan, run_cli, torch_dtype)
from .constants import COLUMNS, DEFAULT_TOPK, KL_DIRECTION


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m parity.first_token", description=__doc__.split("\n\n")[0])
    add_run_arguments(p, backend_help="kernel backend for the bug-budget column (default auto)",
                      profile_help="reference profile anchoring the floor column (logic always uses bf16)",
                      topk_default=DEFAULT_TOPK, topk_help="tokens shown per prompt")
    p.add_argument("--columns", default=",".join(COLUMNS), help="comma-separated subset of logic,floor,bug_budget")
    p.add_argument("--reference-cache", default=None, help="store / reuse reference runs in this directory")
    p.add_argument("--per-token", action="store_true", help="also record per-token rel_diff of every probe")
    p.add_argument("--dry-run", action="store_true", help="print a per-device memory estimate; load nothing")
    return p


def run_summary(result: Any, verdict: Any, df: Any, wall: float) -> dict[str, Any]:
    from .env import code_version, device_name
    from .summary import layer_cosines, stat_block

    spec = result.spec
    pairs = [p for p in COLUMNS if p in result.columns and result.columns[p].ran]
    lc = layer_cosines(df)
    return {
        "run_id": spec.run_id, "code_version": code_version(), "kl_direction": KL_DIRECTION,
        "checkpoint": {"spec": spec.source.spec, "path": str(spec.source.path), "config": spec.source.config_name,
                       "fingerprint": spec.source.fingerprint, "seed": spec.source.seed},
        "plan": spec.plan.to_dict(), "profile": spec.profile, "backend_requested": spec.backend,
        "device": device_name(spec.device), "prompts": [{"id": p.id, "mode": p.mode, "tokens": p.n_tokens}
                                                       for p in spec.prompts],
        "columns": {n: {"ran": c.ran, "reason": c.reason, "anchor": c.anchor, "test": c.test,
                        "load_seconds": c.load_seconds, "kernels_missing": c.kernels_missing,
                        "describe": c.test_describe} for n, c in result.columns.items()},
        "verdict": verdict.summary(),
        "stats": {p: {k: {"value": v[0], "se": v[1]} for k, v in stat_block(df, p).items()} for p in pairs},
        "layer_cosines": lc.to_dict(orient="records"),
        "timing": {"wall_seconds": wall, "reference_load_seconds": result.reference_load_seconds,
                   "reference_cache_hits": result.cache_hits,
                   "forwards": [f.__dict__ for f in result.forwards]},
        "records": len(result.records),
    }


def _dry_run(console: Any, args: argparse.Namespace, plan: Any, device: str) -> int:
    from dsv4.config import REAL_PRESETS, layer_devices, load_config
    from dsv4.tokenizer import load_tokenizer, tiny_tokenizer

    from .inputs import encode_prompts, select_prompts
    from .memory import estimate
    from .records import atomic_write_json

    from .numbers import sig

    config = load_config(args.checkpoint)
    path = Path(args.checkpoint)
    # A real preset (flash, pro) has no tokenizer here: the tiny byte-level one over-counts tokens,
    # which keeps the probe estimate conservative. Tiny presets use that tokenizer anyway.
    tok_dir = path if path.is_dir() else path.parent
    real_tokenizer = path.exists() and (tok_dir / "tokenizer.json").exists()
    tok = load_tokenizer(tok_dir) if real_tokenizer else tiny_tokenizer()
    prompts = encode_prompts(select_prompts(args.mode, args.prompt, args.prompt_set), tok, 1 << 31)
    tokens = max(p.n_tokens for p in prompts)
    dmap = parse_device_map(args.device_map) or {}
    keys: list[Any] = ["embed", *range(config.num_hidden_layers), "head"]
    devices = {k: dmap.get(k, device) for k in keys} if dmap else layer_devices(config, device, None)
    anchors = (1 if args.profile == "bf16" else 2) + 1   # reference profile(s) + the kept emulated run
    est = estimate(config, devices, plan, tokens, 2 if args.ref_dtype == "bf16" else 4, len(prompts), anchors)
    from rich.table import Table

    t = Table(title=f"dry run: weights per device (GiB), config {config.name}, plan {plan.name}; nothing loaded",
              title_justify="left")
    devs = sorted(est["peak_per_device"])
    t.add_column("model")
    for d in devs:
        t.add_column(d, justify="right")
    gib = 1 << 30
    for m in est["models"]:
        t.add_row(m["model"], *[sig(m["per_device"].get(d, 0) / gib, 3) for d in devs])
    t.add_row("peak (models are built one at a time)", *[sig(est["peak_per_device"][d] / gib, 3) for d in devs],
              style="bold")
    console.print(t)
    if path.is_dir():
        from dsv4.checkpoint import open_checkpoint
        from dsv4.checkpoint_plan import checkpoint_plan

        reader = open_checkpoint(path)
        console.print(f"layout {reader.layout.name} ({reader.layout.title}): {reader.layout_reason}")
        cplan = checkpoint_plan(reader)
        if cplan is not None:
            console.print(f"checkpoint plan ({reader.quant_config.source}): {cplan.name}  [--plan checkpoint]")
        if reader.config.ignored_keys:
            console.print(f"config keys ignored (harmless training/engine switches, or unknown keys allowed by "
                          f"DSV4_ALLOW_UNKNOWN_CONFIG_KEYS): {list(reader.config.ignored_keys)}")
    console.print(f"probes copied to the host: {est['probe_host_bytes_per_prompt'] / gib:.3f} GiB per prompt of "
                  f"{tokens} tokens; {est['probe_host_bytes_held'] / gib:.3f} GiB held for {len(prompts)} prompts"
                  + ("" if real_tokenizer or (args.checkpoint not in REAL_PRESETS and not path.is_dir())
                     else "; token count from the tiny byte-level tokenizer (no tokenizer.json)"))
    from .verdict_time import estimate as time_estimate

    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    gpus = {d for d in devices.values() if str(d).startswith("cuda")}
    tte = time_estimate(config, [p.n_tokens for p in prompts], columns, cards=max(1, len(gpus)), may_stream=not dmap)
    for line in tte.lines() if tte else ["time to verdict: no measured per-layer table (benchmarks/results/"
                                         "real_width*.json, written by benchmarks/bench_real_width.py)"]:
        console.print(line, highlight=False, markup=False)
    if args.json:
        atomic_write_json(args.json, {"dry_run": est, "config": config.name, "plan": plan.to_dict(),
                                      "time_to_verdict": tte.__dict__ if tte else None})
    return EXIT_PASS


def main(argv: Sequence[str] | None = None, *, loaders: Any = None, console: Any = None) -> int:
    args = build_parser().parse_args(argv)

    def body(console: Any) -> int:
        from .cli import load_run_source, progress_bars
        from .env import code_version, device_name
        from .records import atomic_write_json, to_frame, write_records
        from .render import (columns_table, header, layer_table, prompt_panel, rules_report, selection_table,
                             stat_table)
        from .rules import load_rules
        from .runner import DefaultLoaders
        from .threeway import RunSpec, settings_from_rules
        from .verdict import evaluate

        t_start = time.perf_counter()
        plan = resolve_run_plan(args.plan, args.checkpoint)
        device = parse_device(args.device, must_exist=not args.dry_run)
        if args.dry_run:
            return _dry_run(console, args, plan, device)
        from .distributed import init, quiet_console, run_threeway_sharded

        world, device = init(device)          # under torchrun: the prompts spread over the ranks
        if not world.main:
            console = quiet_console()
        rules = load_rules(args.rules, args.checkpoint)
        columns = [c.strip() for c in args.columns.split(",") if c.strip()]
        src, prompts = load_run_source(args, device)
        spec = RunSpec(source=src, prompts=prompts, plan=plan, backend=args.backend, profile=args.profile,
                       device=device, device_map=parse_device_map(args.device_map), ref_dtype=torch_dtype(args.ref_dtype),
                       settings=settings_from_rules(rules, args.per_token),
                       reference_cache=Path(args.reference_cache) if args.reference_cache else None,
                       columns=columns)
        with progress_bars(console) as progress:
            result = run_threeway_sharded(spec, loaders or DefaultLoaders(), progress if world.main else None)
        df = to_frame(result.records)
        extra = [f"{n}: FP4 kernels never ran: {m}" for n, c in result.columns.items() for m in c.kernels_missing]
        verdict = evaluate(df, rules, extra)
        if args.records and world.main:
            write_records(args.records, result.records, append=args.append)
        header(console, {"checkpoint": f"{src.spec} ({src.config_name}, fingerprint {src.fingerprint[:12]})",
                         "plan": f"{plan.name}: " + ", ".join(f"{k}={v}" for k, v in plan.components),
                         "reference profile": args.profile, "device": device_name(device),
                         "backend": args.backend, "run": f"{spec.run_id} at {code_version()}",
                         "KL direction": KL_DIRECTION})
        show = result.columns.get("floor") or result.columns.get("logic")
        for p in prompts:
            prompt_panel(console, p, src.tokenizer, show, args.topk)
        pairs = [c for c in COLUMNS if c in result.columns and result.columns[c].ran]
        stat_table(console, df, pairs)
        layer_table(console, df, pairs, [src.config.layer_kind(i) for i in range(src.config.num_hidden_layers)])
        selection_table(console, df)
        columns_table(console, result.columns, verdict)
        rules_report(console, verdict, rules)
        wall = time.perf_counter() - t_start
        fwd = sum(f.seconds for f in result.forwards)
        console.print(f"wall {wall:.1f} s (forwards {fwd:.1f} s, {len(result.forwards)} runs; "
                      f"{len(result.records)} records)")
        if args.json and world.main:
            atomic_write_json(args.json, run_summary(result, verdict, df, wall))
        errors = result.column_errors
        if errors:   # the other columns are reported and written above; this one is the tool's failure
            from .cli import traceback_log
            from .render import error

            for name, e in errors.items():
                error(console, f"column {name} failed ({type(e).__name__}: {e}); traceback in {traceback_log(e)}")
            return EXIT_TOOL_FAILED
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    return run_cli(body, console, outputs_of(args))


if __name__ == "__main__":
    sys.exit(main())
