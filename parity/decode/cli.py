"""The ``python -m parity.decode`` command line (flags shared with ``parity.first_token``).

Exit codes: 0 every check passes, 1 a threshold failure, 2 bad input.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from ..inputs import EncodedPrompt
    from ..runner import ModelLoaders
    from ..source import CheckpointSource
    from .run import DecodeRun, DecodeSpec



from ..cli import (torch_dtype, EXIT_FAIL, EXIT_PASS, add_run_arguments, parse_device, parse_device_map, progress_bars,
                   load_run_source, outputs_of, run_cli)



def build_parser() -> argparse.ArgumentParser:
    from ..constants import DEFAULT_MUTUAL_TOPK, DEFAULT_TOKENS, DEFAULT_TOPK

    p = argparse.ArgumentParser(prog="python -m parity.decode", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--teacher-forced", dest="run_mode", action="store_const", const="teacher_forced",
                   help="feed both models one sequence (default)")
    g.add_argument("--free", dest="run_mode", action="store_const", const="free",
                   help="both models decode greedily on their own")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"steps (generated tokens) per prompt (default {DEFAULT_TOKENS}, or all --forced ids)")
    p.add_argument("--forced", default="greedy",
                   help="teacher-forced sequence: greedy (the reference's continuation), sample (the reference's "
                        "seeded samples), comma-separated ids, or @FILE of ids")
    p.add_argument("--temperature", type=float, default=1.0, help="--forced sample: temperature")
    p.add_argument("--sample-seed", type=int, default=0, help="--forced sample: seed")
    p.add_argument("--probe-steps", default="auto",
                   help="decode steps whose probes are compared (comma-separated; 'auto': 1, the first HCA "
                        "block close, the middle, the last; 'none')")
    p.add_argument("--mutual-topk", type=int, default=DEFAULT_MUTUAL_TOPK,
                   help="--free: a divergence passes when each side's token is in the other's top-k")
    p.add_argument("--graphs", action="store_true",
                   help="native decode steps through the CUDA-graph decoder (dsv4.decode.graphs; CUDA only; "
                        "probe steps stay eager)")
    add_run_arguments(p, backend_help="native kernel backend (default auto)", profile_help="reference profile",
                      topk_default=DEFAULT_TOPK, topk_help="top-k of the overlap statistic")
    return p


def parse_ids(text: str) -> list[int]:
    """``"1, 2 3"`` or ``@path`` (the same format, or a JSON list, in a file)."""
    from ..errors import ParityInputError

    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise ParityInputError(f"--forced {text}: cannot read the file ({e.strerror})") from None
    parts = text.replace("[", " ").replace("]", " ").replace(",", " ").split()
    try:
        ids = [int(x) for x in parts]
    except ValueError:
        raise ParityInputError(f"--forced: expected greedy, sample, integer ids or @FILE, "
                               f"found {text[:60]!r}") from None
    if not ids:
        raise ParityInputError("--forced: expected at least one token id, found none")
    return ids


def parse_steps(text: str) -> str | list[int]:
    from ..errors import ParityInputError

    if text in ("auto", "none"):
        return "auto" if text == "auto" else []
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise ParityInputError(f"--probe-steps: expected 'auto', 'none' or integers, found {text!r}") from None


def _spec(args: argparse.Namespace, src: CheckpointSource, prompts: list[EncodedPrompt], rules: Any,
          device: str) -> DecodeSpec:
    import torch
    from dsv4.plan import resolve_plan
    from ..errors import ParityInputError
    from ..threeway import settings_from_rules
    from .run import DEFAULT_TOKENS, DecodeSpec

    mode = args.run_mode or "teacher_forced"
    forced: str | list[int] = args.forced if args.forced in ("greedy", "sample") else parse_ids(args.forced)
    if mode == "free" and forced != "greedy":
        raise ParityInputError("--forced: applies to --teacher-forced only (--free decodes greedily on both sides)")
    tokens = args.tokens if args.tokens is not None else (len(forced) if isinstance(forced, list) else DEFAULT_TOKENS)
    if args.graphs and torch.device(device).type != "cuda":
        raise ParityInputError(f"--graphs: CUDA-graph decoding needs --device cuda[:N], found {device}")
    if args.mutual_topk < 1 or args.topk < 1:
        raise ParityInputError(f"--mutual-topk / --topk: expected >= 1, found {args.mutual_topk} / {args.topk}")
    settings = replace(settings_from_rules(rules), topk=args.topk)
    return DecodeSpec(source=src, prompts=prompts, plan=resolve_plan(args.plan), mode=mode, tokens=tokens,
                      forced=forced, temperature=args.temperature, sample_seed=args.sample_seed,
                      probe_steps=parse_steps(args.probe_steps), backend=args.backend, profile=args.profile,
                      device=device, device_map=parse_device_map(args.device_map), ref_dtype=torch_dtype(args.ref_dtype),
                      settings=settings, mutual_topk=args.mutual_topk, graphs=args.graphs)


def _decode_label(run: DecodeRun) -> str:
    if not run.graph_segments:
        return "eager decode_step"
    g = sum(s["mode"] == "graph" for s in run.graph_segments)
    return f"CUDA-graph decoder: {g} of {len(run.graph_segments)} segments replayed as graphs"


def _summary(spec: DecodeSpec, run: DecodeRun, verdict: Any, free_fail: list[str], wall: float) -> dict[str, Any]:
    from ..env import code_version, device_name
    from ..logits_stats import KL_DIRECTION, summarize
    from .records import memory_growth_per_step

    prompts = []
    for res in run.results:
        prompts.append({
            "id": res.prompt.id, "mode": res.prompt.mode, "prompt_tokens": res.prompt.n_tokens,
            "steps_compared": res.compared, "probe_steps": res.probe_steps, "stats": summarize(res.stats),
            "continuation": {"reference": res.ref.targets, "native": res.native.targets},
            "divergence": res.divergence,
            "loops": {k: {"describe": v.describe(), "degenerate": v.degenerate,
                          "loops": [{"start": lp.start, "end": lp.end, "period": lp.period, "cycle": list(lp.cycle),
                                     "repeats": lp.repeats, "to_end": lp.to_end} for lp in v.loops],
                          "distinct_ngram_ratio": v.distinct_ngram_ratio} for k, v in res.loops.items()},
            "memory": {"kind": res.native.memory_kind,
                       "native_bytes_per_step": memory_growth_per_step(res.native.memory),
                       "reference_bytes_per_step": memory_growth_per_step(res.ref.memory)},
            "seconds": {"reference": sum(res.ref.seconds), "native": sum(res.native.seconds)},
        })
    return {"run_id": spec.run_id, "code_version": code_version(), "kl_direction": KL_DIRECTION,
            "mode": spec.mode, "pair": spec.pair, "tokens": spec.tokens,
            "forced": spec.forced if isinstance(spec.forced, str) else "ids",
            "checkpoint": {"spec": spec.source.spec, "config": spec.source.config_name,
                           "fingerprint": spec.source.fingerprint, "seed": spec.source.seed},
            "plan": spec.plan.to_dict(), "profile": spec.profile, "backend": run.native_backend,
            "device": device_name(spec.device), "near_tie_logprob": spec.settings.near_tie,
            "verdict": verdict.summary(), "free_running_failures": free_fail, "prompts": prompts,
            "native_decode": "cuda_graphs" if spec.graphs else "eager", "graph_segments": run.graph_segments,
            "timing": {"wall_seconds": wall, **run.timing},
            "audit": run.audit.summary() if run.audit is not None else None}


def main(argv: Sequence[str] | None = None, *, loaders: ModelLoaders | None = None,
         console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body(console: Console) -> int:
        from ..env import code_version, device_name
        from ..logits_stats import KL_DIRECTION
        from ..records import atomic_write_json, to_frame, write_records
        from ..render import header, rules_report
        from ..rules import load_rules
        from ..verdict import evaluate
        from .records import aggregate_records, context, free_running_failures, prompt_records
        from .render import audit_report, probe_table, stat_table, step_table, streams_panel
        from .run import run_decode

        t_start = time.perf_counter()
        device = parse_device(args.device)
        rules = load_rules(args.rules, args.checkpoint)
        src, prompts = load_run_source(args, device)
        spec = _spec(args, src, prompts, rules, device)
        with progress_bars(console) as progress:
            run = run_decode(spec, loaders, progress)
        ctx = context(spec, run.native_backend)
        per_prompt = [prompt_records(spec, ctx, res) for res in run.results]
        records = [x for recs in per_prompt for x in recs] + aggregate_records(spec, ctx, run.results)
        if run.audit is not None:   # judged by the built-in exact rules (audit_violations <= 0)
            records += run.audit.records(ctx, {res.prompt.id: res.prompt.mode for res in run.results})
        df = to_frame(records)
        free_fail = free_running_failures(df) if spec.mode == "free" else []
        verdict = evaluate(df, rules, free_fail)
        if args.records:
            write_records(args.records, records, append=args.append)
        header(console, {"checkpoint": f"{src.spec} ({src.config_name}, fingerprint {src.fingerprint[:12]})",
                         "plan": f"{spec.plan.name}: " + ", ".join(f"{k}={v}" for k, v in spec.plan.components),
                         "reference profile": spec.profile, "native backend": run.native_backend,
                         "device": device_name(device), "pair": spec.pair,
                         "native decode": _decode_label(run),
                         "decode": f"{spec.mode.replace('_', '-')}, {spec.tokens} steps"
                                   + (f", forced {spec.forced}" if spec.mode == "teacher_forced"
                                      and isinstance(spec.forced, str) else ""),
                         "run": f"{spec.run_id} at {code_version()}", "KL direction": KL_DIRECTION})
        kinds = [src.config.layer_kind(i) for i in range(src.config.num_hidden_layers)]
        for res, recs in zip(run.results, per_prompt):
            streams_panel(console, res, src.tokenizer)
            step_table(console, res)
            probe_table(console, recs, res, kinds)
        stat_table(console, df, spec.pair, spec.mode.replace("_", "-"))
        if run.audit is not None:
            audit_report(console, run.audit, run.native_backend)
        rules_report(console, verdict, rules)
        wall = time.perf_counter() - t_start
        steps = sum(r.compared for r in run.results)
        console.print(f"wall {wall:.1f} s ({len(run.results)} prompt(s) x {spec.tokens} steps per model, "
                      f"{steps} steps compared; {len(records)} records)")
        if args.json:
            atomic_write_json(args.json, _summary(spec, run, verdict, free_fail, wall))
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    return run_cli(body, console, outputs_of(args))


