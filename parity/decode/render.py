"""Rich rendering of a decode run (the CLI prints these; nothing here computes a verdict)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import pandas as pd
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..logits_stats import KL_DIRECTION, summarize
from ..records import ALL_PROMPTS
from ..numbers import sig
from ..render import token_text
from .records import STEP_PREFIX, logit_ranges
from .run import PromptResult

WINDOWS = 6   # rows of the per-prompt step table


def _bytes(v: float) -> str:
    if math.isnan(v):
        return "—"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= scale:
            return f"{v / scale:+.2f} {unit}"
    return f"{v:+.0f} B"


def step_table(console: Console, res: PromptResult) -> None:
    st, r, n = res.stats, res.ref, res.native
    t = Table(title=f"{res.prompt.id}: {res.compared} steps compared, KL(reference || native); mem Δ = native "
                    f"{n.memory_kind} growth over the window", title_justify="left")
    for c in ("steps", "KL mean ± SE", "KL max", "top-1 (tie-aware)", "near ties", "logit range nat/ref",
              "mem Δ", "ms/step"):
        t.add_column(c, justify="right")
    rr, nr = logit_ranges(r.logits), logit_ranges(n.logits)
    bounds = sorted({round(i * res.compared / WINDOWS) for i in range(WINDOWS + 1)})
    for a, b in zip(bounds, bounds[1:]):
        w = summarize(st.select(slice(a, b)))
        ms = 1000 * sum(n.seconds[max(a, 1):b]) / max(b - max(a, 1), 1)
        t.add_row(f"{a}–{b - 1}", f"{sig(w['kl_mean'])} ± {sig(w['kl_se'], 2)}", sig(w["kl_max"]),
                  f"{w['top1_agree_rate']:.3f} ({w['top1_agree_tieaware_rate']:.3f})",
                  str(int(st.near_tie[a:b].sum())), f"{float(nr[a:b].mean()):.3g}/{float(rr[a:b].mean()):.3g}",
                  _bytes(float(n.memory[b - 1] - n.memory[a])), f"{ms:.1f}")
    console.print(t)


def probe_table(console: Console, recs: Sequence[dict[str, Any]], res: PromptResult, kinds: Sequence[str]) -> None:
    if not res.probe_steps:
        return
    cos = [x for x in recs if x["metric"] == STEP_PREFIX + "cosine" and x["step"] is not None]
    t = Table(title=f"{res.prompt.id}: per-layer cosine at probe steps (layer output | worst probe of the layer)",
              title_justify="left")
    t.add_column("layer")
    for s in res.probe_steps:
        t.add_column(f"step {s} (pos {res.ref.positions[s]})", justify="right")
    for layer in [*range(len(kinds)), None]:
        cells = []
        for s in res.probe_steps:
            mine = [x for x in cos if x["step"] == s and x["layer"] == layer]
            if not mine:
                cells.append("—")
                continue
            out = next((x for x in mine if x["probe"] == (f"layers.{layer}.out" if layer is not None else "hc_head")),
                       None)
            worst = min(mine, key=lambda x: x["value"])
            short = worst["probe"].removeprefix(f"layers.{layer}.")
            cells.append(f"{sig(out['value'] if out else math.nan, 5)} | {sig(worst['value'], 4)} {short}")
        t.add_row("head" if layer is None else f"{layer} ({kinds[layer]})", *cells)
    console.print(t)


def _stream_text(tok: Any, ids: Sequence[int], hi: int | None = None) -> Text:
    out = Text()
    for i, t in enumerate(ids):
        out.append(token_text(tok, t), style="bold red" if i == hi else ("dim" if i % 2 else ""))
    return out


def streams_panel(console: Console, res: PromptResult, tok: Any, show: int = 48) -> None:
    body = Table.grid(padding=(0, 1))
    d = res.divergence
    if d is None:
        body.add_row(Text("forced", style="bold"), _stream_text(tok, res.ref.targets[:show]))
        body.add_row(Text("loops", style="bold"), Text(res.loops["forced"].describe()))
    else:
        lo = max(0, d["step"] - show // 2) if d.get("found") else 0
        hi = d["step"] - lo if d.get("found") else None
        for side, run in (("reference", res.ref), ("native", res.native)):
            body.add_row(Text(side, style="bold"), _stream_text(tok, run.targets[lo:lo + show], hi))
        if d.get("found"):
            kind = "near tie" if d["near_tie"] else ("mutual top-%d" % d["k"] if d["mutual_topk"] else "CLEAR FLIP")
            body.add_row(Text("divergence", style="bold"), Text(
                f"step {d['step']} (position {d['position']}): reference {d['ref_token']} vs native "
                f"{d['native_token']}; reference top-2 margin {d['ref_top2_margin']:.3g} nats; native token rank "
                f"{d['native_token_ref_rank']} in the reference, reference token rank {d['ref_token_native_rank']} "
                f"in native -> {kind}", style="green" if kind != "CLEAR FLIP" else "bold red"))
        else:
            body.add_row(Text("divergence", style="bold"), Text(f"none in {len(res.ref.targets)} steps"))
        for side in ("reference", "native"):
            body.add_row(Text(f"{side} loops", style="bold"), Text(res.loops[side].describe()))
    console.print(Panel(body, title=f"prompt {res.prompt.id} ({res.prompt.mode}, {res.prompt.n_tokens} tokens)"))


STAT_ROWS = (("KL mean", "kl_mean", "kl_se"), ("KL p50", "kl_p50", None), ("KL p90", "kl_p90", None),
             ("KL p99", "kl_p99", None), ("KL max", "kl_max", None),
             ("top-1 agreement", "top1_agree_rate", "top1_agree_se"),
             ("top-1 agreement (near ties forgiven)", "top1_agree_tieaware_rate", None),
             ("near-tie steps", "near_tie_rate", None), ("top-k overlap", "topk_overlap_mean", None),
             ("dp of the forced token (mean)", "forced_dp_mean", "forced_dp_se"),
             ("RMS dp of the forced token", "forced_dp_rms", "forced_dp_rms_se"),
             ("ln(PPL native / PPL ref), forced tokens", "forced_ln_ppl_ratio_mean", "forced_ln_ppl_ratio_se"),
             ("steps compared", "n_positions", None))


def stat_table(console: Console, df: pd.DataFrame, pair: str, mode: str) -> None:
    rows = df[(df["prompt_id"] == ALL_PROMPTS) & (df["probe"] == "logits")]
    vals = dict(zip(rows["metric"], rows["value"]))
    t = Table(title=f"{pair}: decode logits statistics over every compared step ({mode}) — {KL_DIRECTION}",
              title_justify="left")
    t.add_column("statistic")
    t.add_column(pair, justify="right")
    for label, metric, se in STAT_ROWS:
        if metric in vals:
            e = vals.get(se) if se else None
            t.add_row(label, sig(vals[metric], 4) + (f" ± {sig(e, 2)}" if e is not None else ""))
    console.print(t)


def audit_report(console: Any, auditor: Any, backend: str) -> None:
    """The exact kernel audit of the native decode: every eager kernel call replayed through the oracle."""
    s = auditor.summary()
    for v in auditor.violations[:10]:
        console.print(f"VIOLATION {v.describe()}", markup=False, highlight=False, soft_wrap=True)
    for e in auditor.errors[:10]:
        console.print(f"ERROR {e}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"kernel audit on {backend}: {s['calls']} calls, {s['violating_calls']} violating, "
                  f"{len(s['errors'])} not replayable"
                  + (f", {s['captured']} made inside CUDA-graph captures (recorded, not run: not judged)"
                     if s.get("captured") else "") + f" -> {'PASS' if auditor.passed else 'FAIL'}",
                  markup=False, highlight=False, soft_wrap=True)
