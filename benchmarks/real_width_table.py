"""The time-to-verdict table (markdown) from bench_real_width.py JSON files.

    python benchmarks/real_width_table.py RESULTS.json [MORE.json ...] [--out reports/real_width.md]

Part 1, measured: per layer kind and side (streaming reference, native per backend), seconds per
layer at each prefill length and per decode step, peak GPU memory; the two targets (harness
overhead, streaming-reference memory) as the bench measured them.
Part 2, extrapolated (``parity.verdict_time``, each assumption printed under its row): a first-token
verdict (logic + floor + bug-budget columns, 5 prompts of 1k tokens) on full Flash (43 layers) and
Pro (61 layers), with every column and with floor + bug budget only, on one H100, one H200, and 8x B200
(prompts over ranks, each rank holding its own models, or one process with the layers spread by a device
map); a row whose cards cannot hold the resident native models says so and names the cards it needs
(``parity.verdict_fit``). Over ranks: the per-rank time of one of 8 prompt shares (``torchrun``), which
assumes the prompts divide evenly, each rank loading at the measured machine's read rate (the aggregate
the node must serve named). B200 times scale the H100 table by memory bandwidth.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [1024] * 5
DECODE_STEPS = 300
FLOOR_CONFIGS = 16        # about what a steepest floor search visits over the model's precision classes
COLUMNS = ("logic", "floor", "bug_budget")
TARGETS = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "B200": "NVIDIA B200"}


def gib(b: float | None) -> str:
    return "-" if not b else f"{b / 2 ** 30:.2f}"


def measured(d: dict) -> list[str]:
    m = d["machine"]
    out = [f"## Measured: {d['model']} ({d['width']} width, {d['config']['num_hidden_layers']} layers) on {m['card']}",
           "", f"layer kinds {d['config']['layer_kinds']}; D={d['config']['hidden_size']}, "
               f"{d['config']['n_routed_experts']} experts top-{d['config']['num_experts_per_tok']}, "
               f"vocab {d['config']['vocab_size']}; bench wall {d.get('wall_s', 0):.0f} s", "",
           "| side | phase | tokens | layer kind | s / layer | peak GPU GiB | host RSS GiB | disk read GiB |",
           "|---|---|---|---|---|---|---|---|"]
    # tables written before the bench warmed up at every length: the first native layer at a new token
    # count (and the first decode step) include that shape's kernel compile; marked, not corrected
    warm = {(r["backend"], r.get("tokens")) for r in d["runs"] if r["phase"] == "warmup"}
    cold = False
    for r in d["runs"]:
        if r["phase"] not in ("prefill",):
            continue
        by: dict[str, list[dict]] = {}
        for x in r["layers"]:
            by.setdefault(x["kind"], []).append(x)
        mark = ""
        if r["side"] == "native" and (r["backend"], r["tokens"]) not in warm:
            mark, cold = " *", True
        for k, xs in by.items():
            out.append(f"| {r['backend']}{mark} | prefill | {r['tokens']} | {k} | {sum(x['seconds'] for x in xs) / len(xs):.4g} | "
                       f"{gib(max(x['peak_gpu_bytes'] for x in xs))} | {gib(max(x.get('host_rss_bytes') or 0 for x in xs))} | "
                       f"{gib(sum(x['disk_read_bytes'] for x in xs) / len(xs))} |")
    for r in d.get("decode", []):
        by2: dict[str, list[float]] = {}
        for x in r["layers"]:
            by2.setdefault(x["kind"], []).append(x["seconds_per_step"])
        mark = "" if "warmup_step_seconds" in r or r["side"] != "native" else " *"
        cold = cold or bool(mark)
        for k, v in by2.items():
            out.append(f"| {r['backend']}{mark} | decode ({r['cache_tokens']}-token cache) | 1 | {k} | {sum(v) / len(v):.4g} | - | - | - |")
    peak_host = max((x.get("host_peak_rss_bytes") or 0 for r in d["runs"] for x in r.get("layers", [])), default=0)
    out += ["", "host RSS: the process's resident memory after the layer (its lifetime peak: "
            f"{gib(peak_host)} GiB, weights generation included); disk read: bytes the kernel read from the "
            "device for the layer (files the bench had just written may come from the page cache: a lower bound)."]
    if cold:
        out += ["", "\\* measured without a warm-up at that token count (a bench before the per-length warm-up): the "
                "first layer to run (and the mean over decode steps, the first included) holds the kernels' compile "
                "for that shape; the other layers of the same row are the steady state."]
    t = d.get("targets", {})
    out += ["", "| target | measured | goal | met |", "|---|---|---|---|"]
    h = t.get("harness_overhead")
    if h:
        out.append(f"| harness overhead (harness time / its plain forwards - 1) | "
                   f"{', '.join(f'{x:+.2f}' for x in h['measured']) or 'not measured'} | <= 0.25 | {h['met']} |")
        if h.get("per_prompt"):
            out.append(f"| per further prompt (loads and the weight audit, once per checkpoint, excluded) | "
                       f"{', '.join(f'{x:+.2f}' for x in h['per_prompt'])} | <= 0.25 | {max(h['per_prompt']) <= 0.25} |")
    for hh in d.get("harness", []):
        if hh.get("phases"):
            out.append(f"| harness at {hh['tokens']} tokens, where the time went (s) | "
                       + ", ".join(f"{k} {v:.1f}" for k, v in hh["phases"].items()) + " | - | - |")
    s = t.get("streaming_memory")
    if s:
        out.append(f"| streaming reference peak / bound ({s['measured_on']}, {s['tokens']} tokens) | "
                   f"{s['ratio_to_bound']:.2f} ({gib(s['measured_peak_bytes'])} / {gib(s['bound_bytes'])} GiB) | <= 1 | {s['met']} |")
        out.append(f"| peak after {s['flat_layers'][1]} layers / after {s['flat_layers'][0]} | "
                   f"{s['flat_ratio']:.3f} | ~1 (flat) | {s['flat_ratio'] is not None and s['flat_ratio'] < 1.1} |")
    cap = [x for x in d.get("probe_capture", []) if "skipped" not in x]
    if cap:
        out += ["", "| probe capture | tokens | probes | host GiB | plain s | synchronous pageable copies s | "
                "pinned non-blocking copies s | same values |", "|---|---|---|---|---|---|---|---|"]
        out += [f"| {x['backend']} | {x['tokens']} | {x['probes']} | {gib(x['host_bytes'])} | {x['plain_seconds']:.3f} | "
                f"{x['pageable_sync_seconds']:.3f} | {x['pinned_async_seconds']:.3f} | {x['pinned_equal']} |" for x in cap]
    if d.get("skipped"):
        out += ["", "Skipped: " + "; ".join(f"{x['stage']} ({x['reason']})" for x in d["skipped"])]
    return out + [""]


# (row label, card, cards, prompt shares, each rank holding its own models)
WHERE = (("1x H100", TARGETS["H100"], 1, 1, False), ("1x H200", TARGETS["H200"], 1, 1, False),
         ("8x B200, prompts over 8 ranks (torchrun)", TARGETS["B200"], 8, 8, True),
         ("8x B200, one process, layers by device map", TARGETS["B200"], 8, 1, False))


def fit_cell(e, per_rank: bool = False) -> str:
    """The estimate, or why it cannot run as estimated: a model that does not fit one card a rank cannot
    be split that way; one that does not fit the cards named runs over more of them by a device map (one
    process, the layers in turn: the same time, on that many cards)."""
    from parity.verdict_time import card_family, fmt_seconds

    t = fmt_seconds(e.seconds)
    if e.fits:
        return t
    if per_rank:
        return f"**does not fit one card a rank** ({t} if it did)"
    if e.cards_needed is None:
        return f"**does not fit** ({t} if it did)"
    return f"**needs {e.cards_needed} x {card_family(e.card)}** by device map: {t}"


def extrapolated(tables: list[dict]) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from dsv4.config import preset
    from parity.verdict_time import estimate

    out = [f"## Extrapolated: a first-token verdict ({len(PROMPTS)} prompts x {PROMPTS[0]} tokens)", "",
           "The reference streams one layer at a time. The native model is resident (built whole on its "
           "card, or spread by a device map) where it fits; on one card it otherwise streams (dsv4.streamed: "
           "the layers that fit stay, the others are read again on every pass, counted as native_rereads), "
           "and a row whose cards can do neither says so, its memory note naming the cards it needs.", "",
           "| model | columns | where | estimate | memory | from |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for model in ("flash", "pro"):
        c = preset(model)
        for columns in (COLUMNS, COLUMNS[1:]):
            for where, card, cards, shares, per_rank in WHERE:
                prompts = PROMPTS[: max(1, -(-len(PROMPTS) // shares))]
                e = estimate(c, prompts, columns, card=card, tables=tables, readers=shares, cards=cards,
                             per_rank=per_rank)
                label = " + ".join(columns)
                if e is None:
                    out.append(f"| {model} | {label} | {where} | no table | - | - |")
                    continue
                n = len(notes) + 1
                notes.append(f"{n}. {model}, {label}, {where}: " + "; ".join(e.assumptions)
                             + (f"; {len(prompts)} of {len(PROMPTS)} prompts per rank" if shares > 1 else ""))
                out.append(f"| {model} | {label} | {where} | {fit_cell(e, per_rank)} | {e.fit} | {e.table} "
                           f"({e.table_card}) [{n}] |")
    return out + ["", "Assumptions:", ""] + notes + [""] + extrapolated_runs(tables)


def extrapolated_runs(tables: list[dict]) -> list[str]:
    """A 300-token teacher-forced decode and a floor search, full Flash and Pro (parity.verdict_time_runs)."""
    from dsv4.config import preset
    from parity.verdict_time import fmt_seconds
    from parity.verdict_time_runs import decode_estimate, floor_search_estimate

    out = [f"## Extrapolated: a {DECODE_STEPS}-token teacher-forced decode (one {PROMPTS[0]}-token prompt) and a "
           f"floor search of {FLOOR_CONFIGS} configurations ({len(PROMPTS)} prompts x {PROMPTS[0]} tokens)", "",
           "| run | model | where | estimate | memory | from |", "|---|---|---|---|---|---|"]
    notes: list[str] = []
    for model in ("flash", "pro"):
        c = preset(model)
        for where, card, cards, ranks, per_rank in WHERE:
            per = -(-FLOOR_CONFIGS // ranks)
            runs = [("floor search", floor_search_estimate(c, per, PROMPTS, card=card, tables=tables, readers=ranks,
                                                          cards=cards, per_rank=per_rank))]
            if ranks == 1:
                runs.insert(0, ("decode", decode_estimate(c, DECODE_STEPS, PROMPTS[0], card=card, tables=tables,
                                                          cards=cards)))
            rank_where = where.replace("prompts over", "configurations over")
            for run, e in runs:
                if e is None:
                    out.append(f"| {run} | {model} | {rank_where} | no table | - | - |")
                    continue
                n = len(notes) + 1
                notes.append(f"{n}. {run}, {model}, {rank_where}: " + "; ".join(e.assumptions)
                             + (f"; {per} of {FLOOR_CONFIGS} configurations per rank, the reference cache shared"
                                if ranks > 1 else ""))
                parts = ", ".join(f"{k} {fmt_seconds(v)}" for k, v in e.breakdown.items())
                out.append(f"| {run} | {model} | {rank_where} | {fit_cell(e, per_rank)} ({parts}) | {e.fit} | {e.table} "
                           f"({e.table_card}) [{n}] |")
    return out + ["", "Assumptions:", ""] + notes + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="+", help="bench_real_width.py outputs")
    p.add_argument("--out", default=None, help="markdown file (default: print)")
    a = p.parse_args(argv)
    tables = []
    for f in a.json:
        try:
            d = json.loads(Path(f).read_text())
        except (OSError, json.JSONDecodeError) as e:
            p.error(f"{f}: expected a bench_real_width.py JSON, found {type(e).__name__}: {e}")
        if d.get("bench") != "real_width":
            p.error(f"{f}: expected a bench_real_width.py JSON (bench: real_width), found bench {d.get('bench')!r}")
        d["_file"] = str(f)
        tables.append(d)
    lines = ["# Time to verdict at real width", ""]
    for d in tables:
        lines += measured(d)
    lines += extrapolated(tables)
    text = "\n".join(lines)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        print(f"wrote {a.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
