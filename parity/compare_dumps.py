"""``python -m parity.compare_dumps --dumps DIR [--checkpoint DIR|PRESET]``: judge another engine.

Every dump (:mod:`parity.dumps`) is checked against the checkpoint before anything runs: token ids
inside the vocabulary and, when the manifest names a prompt of the standard set (or carries the
prompt text), equal to its encoding; every probe the config's layer kinds emit present. The
reference then runs on the dump's token ids (``--reference-cache`` reuses it) and the same per-probe,
first-token and rule logic as ``parity.first_token`` judges the dump as the test side of ``--pair``
(default ``floor``: an NVFP4 engine; ``logic`` for a BF16 engine). Engine dumps have no isolated
mode, so the first failing probe is a *propagated* one. Exit 0 pass, 1 threshold failure, 2 bad
input (missing probes, mismatched shapes or token ids, prompts the tokenizer cannot encode).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from dsv4.checkpoint.builtin import add_checkpoint_argument

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from rich.console import Console
    from .dumps import Dump
    from .inputs import EncodedPrompt
    from .runner import ModelLoaders
    from .source import CheckpointSource



from .cli import EXIT_FAIL, EXIT_PASS, outputs_of, parse_device, progress_bars, run_cli, set_threads


def dump_prompt(dump: Dump, src: CheckpointSource) -> EncodedPrompt:
    """The dump's prompt, validated against the checkpoint's vocabulary and tokenizer."""
    from dsv4.prompts import load_prompt_set
    from .errors import DumpError
    from .inputs import EncodedPrompt, encode_prompts

    ids, vocab = dump.token_ids, src.config.vocab_size
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise DumpError(f"dump {dump.path}: token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
    by_id = {p.id: p for p in load_prompt_set()}
    pid, text = dump.manifest.get("prompt_id"), dump.manifest.get("prompt_text")
    if pid in by_id:
        enc = encode_prompts([by_id[pid]], src.tokenizer, vocab)[0]
        if enc.mode != dump.prompt_mode:
            raise DumpError(f"dump {dump.path}: prompt {pid!r} is a {enc.mode!r} prompt, manifest says "
                            f"{dump.prompt_mode!r}")
        expected, text = list(enc.ids), enc.text
        what = f"the prompt set's encoding of {pid!r}"
    elif text is not None:
        expected = src.tokenizer.encode(text, max_id=vocab - 1)
        what = "the tokenizer's encoding of the manifest's prompt_text"
    else:
        return EncodedPrompt(dump.prompt_id, dump.prompt_mode, "", tuple(ids))
    if expected != ids:
        first = next((n for n, (a, b) in enumerate(zip(expected, ids)) if a != b), min(len(expected), len(ids)))
        raise DumpError(f"dump {dump.path}: token ids differ from {what} at position {first} "
                        f"(dump has {len(ids)} ids, expected {len(expected)})")
    return EncodedPrompt(dump.prompt_id, dump.prompt_mode, text, tuple(ids))


def check_probe_set(dump: Dump, src: CheckpointSource) -> None:
    from dsv4.probes import probe_names
    from .errors import DumpError

    c = src.config
    expected = probe_names(c.num_hidden_layers, [c.layer_kind(i) for i in range(c.num_hidden_layers)])
    missing = [n for n in expected if n not in dump.probes]
    if dump.manifest.get("probe_subset") is True:   # judged on what it holds (some layers, or only the logits)
        if not any(n in dump.probes for n in [*expected, "logits"]):
            raise DumpError(f"dump {dump.path}: a probe_subset dump must hold at least one probe of this config "
                            f"(docs/model_surface.md), found {sorted(dump.probes)[:6]}")
        return
    if missing:
        more = f" (and {len(missing) - 10} more)" if len(missing) > 10 else ""
        raise DumpError(f"dump {dump.path}: missing probes {missing[:10]}{more}; a dump must hold every probe "
                        f"the config's layer kinds emit (docs/model_surface.md)")


def check_shapes(dump: Dump, anchor: dict[str, torch.Tensor]) -> None:
    from .errors import DumpError

    bad = [f"{n}: dump {tuple(dump.probes[n].shape)}, reference {tuple(t.shape)}"
           for n, t in anchor.items() if n in dump.probes and tuple(dump.probes[n].shape) != tuple(t.shape)]
    if bad:
        raise DumpError(f"dump {dump.path}: probe shapes differ from the reference's: " + "; ".join(bad[:6]))


def main(argv: Sequence[str] | None = None, *, loaders: ModelLoaders | None = None,
         console: Console | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m parity.compare_dumps", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dumps", required=True, help="a dump directory, or a directory of dump directories")
    add_checkpoint_argument(ap)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", choices=("bf16", "official"), default="bf16")
    ap.add_argument("--pair", choices=("floor", "logic"), default="floor", help="which column's rules judge the dumps")
    ap.add_argument("--device", default=None)
    ap.add_argument("--rules", default=None)
    ap.add_argument("--records", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--reference-cache", default=None)
    ap.add_argument("--topk", type=int, default=5)
    args = ap.parse_args(argv)

    def body(console: Console) -> int:
        from .compare import Where, compare_probes
        from .dumps import find_dumps, read_dump
        from .env import code_version
        from .errors import DumpError
        from .logits_stats import FIRST_PREFIX, KL_DIRECTION, PositionStats, summarize
        from .records import ALL_PROMPTS, atomic_write_json, to_frame, write_records
        from .render import layer_table, prompt_panel, rules_report, selection_table, stat_table
        from .rules import load_rules
        from .runner import DefaultLoaders
        from .source import resolve_checkpoint
        from .threeway import (ColumnResult, RunSpec, logic_anchor_label, run_context, run_reference, set_mode_of,
                               settings_from_rules)
        from .verdict import evaluate

        t0 = time.perf_counter()
        rules = load_rules(args.rules, args.checkpoint)
        device = parse_device(args.device)
        src = resolve_checkpoint(args.checkpoint, args.seed)
        set_threads(None, device, src.config)
        dumps = [read_dump(p) for p in find_dumps(args.dumps)]
        engines = sorted({d.engine for d in dumps})
        if len(engines) > 1:
            raise DumpError(f"--dumps: expected dumps of one engine, found {engines}")
        for d in dumps:
            check_probe_set(d, src)
        prompts = [dump_prompt(d, src) for d in dumps]
        spec = RunSpec(source=src, prompts=prompts, profile=args.profile, device=device,
                       settings=settings_from_rules(rules),
                       reference_cache=Path(args.reference_cache) if args.reference_cache else None)
        with progress_bars(console) as progress:
            anchors, _ = run_reference(spec, args.profile, loaders or DefaultLoaders(), progress, pair=args.pair)
        ctx = run_context(spec, plan=str(dumps[0].manifest.get("plan") or f"engine:{engines[0]}"),
                       profile=args.profile, backend=engines[0])
        records, stats = [], []
        anchor_label = logic_anchor_label() if args.pair == "logic" else f"reference:{args.profile}"
        column = ColumnResult(args.pair, anchor_label, f"engine:{engines[0]}", True)
        for d, p, anchor in zip(dumps, prompts, anchors):
            check_shapes(d, anchor.probes)
            judged = {n: t for n, t in anchor.probes.items() if n in d.probes}   # a subset dump: what it holds
            recs, st = compare_probes(judged, d.probes, where=Where(ctx, args.pair, "propagated", p.id, p.mode),
                                      config=src.config, ids=p.tensor(), router_bias=src.router_bias,
                                      settings=spec.settings)
            records += recs
            if st is not None:   # a subset dump without logits has no position statistics
                stats.append(st)
                column.last_logits[p.id] = (anchor.logits[-1].float(), d.probes["logits"][-1].float())
        where = Where(ctx, args.pair, "propagated", ALL_PROMPTS, set_mode_of(prompts))
        firsts = [s.select(slice(s.n - 1, s.n)) for s in stats]
        aggregates = {**summarize(PositionStats.concat(stats)),
                      **summarize(PositionStats.concat(firsts), FIRST_PREFIX)} if stats else {}
        for m, v in aggregates.items():
            records.append(where.rec("logits", m, v))
        df = to_frame(records)
        verdict = evaluate(df, rules, divergence_mode="propagated")
        if args.records:
            write_records(args.records, records)
        console.print(f"engine {engines[0]} ({len(dumps)} dumps) vs {anchor_label} on {src.spec} "
                      f"({src.config_name}); judged as pair {args.pair!r}; {KL_DIRECTION}")
        unjudged = sorted({n for d, a in zip(dumps, anchors) for n in a.probes if n not in d.probes})
        if unjudged:
            console.print(f"not in the dumps (probe_subset), not judged: {len(unjudged)} probes, e.g. "
                          f"{', '.join(unjudged[:6])}")
        for p in prompts:
            prompt_panel(console, p, src.tokenizer, column, args.topk)
        stat_table(console, df, [args.pair])
        layer_table(console, df, [args.pair], [src.config.layer_kind(i) for i in range(src.config.num_hidden_layers)])
        selection_table(console, df)
        d = verdict.first_divergence.get(args.pair)
        console.print(f"first failing probe (propagated: isolated mode needs the engine itself): "
                      f"{d.describe() if d else 'none'}")
        rules_report(console, verdict, rules)
        console.print(f"wall {time.perf_counter() - t0:.1f} s, {len(records)} records, code {code_version()}")
        if args.json:
            atomic_write_json(args.json, {"engine": engines[0], "dumps": [str(d.path) for d in dumps],
                                          "verdict": verdict.summary()})
        return EXIT_PASS if verdict.passed else EXIT_FAIL

    return run_cli(body, console, outputs_of(args))


if __name__ == "__main__":
    sys.exit(main())
