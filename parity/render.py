"""Rich rendering for the CLIs (libraries never print; the CLIs call these with a Console)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from dsv4.tokenizer import DSV4Tokenizer

from .inputs import EncodedPrompt
from .logits_stats import KL_DIRECTION, top_tokens
from .numbers import sig
from .rules import RuleSet
from .summary import layer_cosines, selection_summary, stat_block
from .threeway import COLUMNS, ColumnResult
from .verdict import Verdict

PROMPT_CHARS = 360


def _gpt2_char_to_byte() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet (printable bytes as themselves, others at U+0100+n)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


_CHAR_TO_BYTE = _gpt2_char_to_byte()


def token_text(tok: DSV4Tokenizer, token_id: int) -> str:
    """The token as text; a fragment of a multi-byte character (which decodes to U+FFFD) as its
    bytes, e.g. ``b'\\xe6\\x9c'``, so two different fragments never look the same."""
    text = tok.decode([token_id])
    if "\ufffd" in text:
        piece = tok.id_to_token(token_id)
        if all(c in _CHAR_TO_BYTE for c in piece):
            return repr(bytes(_CHAR_TO_BYTE[c] for c in piece))
    return repr(text)[1:-1] if text.strip() else repr(text)


def header(console: Console, info: Mapping[str, Any]) -> None:
    t = Table.grid(padding=(0, 2))
    for k, v in info.items():
        t.add_row(Text(k, style="bold"), Text(str(v)))
    console.print(Panel(t, title="parity run", expand=False))


def prompt_panel(console: Console, p: EncodedPrompt, tok: DSV4Tokenizer, column: ColumnResult | None, k: int) -> None:
    text = p.text if len(p.text) <= PROMPT_CHARS else "…" + p.text[-PROMPT_CHARS:]
    body: list[Any] = [Text(text, style="dim")]
    if column is not None and p.id in column.last_logits:
        ref, test = column.last_logits[p.id]
        t = Table(title=f"first token: top-{k} of {column.anchor} vs {column.test}", title_justify="left")
        for c in ("rank", "id", "token", "ref logit", "ref p", "native logit", "native p", "native rank"):
            t.add_column(c, justify="right" if c not in ("token",) else "left")
        for row in top_tokens(ref, test, k):
            style = "" if row.test_rank == row.rank else "yellow"
            t.add_row(str(row.rank), str(row.token_id), escape(token_text(tok, row.token_id)), f"{row.ref_logit:.3f}",
                      f"{row.ref_prob:.4f}", f"{row.test_logit:.3f}", f"{row.test_prob:.4f}", str(row.test_rank),
                      style=style)
        body.append(t)
    console.print(Panel(Group(*body), title=f"prompt {p.id} ({p.mode}, {p.n_tokens} tokens)", expand=True))


def stat_table(console: Console, df: pd.DataFrame, pairs: Sequence[str]) -> None:
    blocks = {p: stat_block(df, p) for p in pairs}
    t = Table(title=f"logits statistics, propagated, all prompt positions (teacher-forced) — {KL_DIRECTION}",
              title_justify="left")
    t.add_column("statistic")
    for p in pairs:
        t.add_column(p, justify="right")
    labels = [lbl for b in blocks.values() for lbl in b]
    for label in dict.fromkeys(labels):
        cells = []
        for p in pairs:
            v = blocks[p].get(label)
            cells.append("—" if v is None else sig(v[0]) + (f" ± {sig(v[1], 2)}" if v[1] is not None else ""))
        t.add_row(label, *cells)
    console.print(t)


def layer_table(console: Console, df: pd.DataFrame, pairs: Sequence[str], layer_kinds: Sequence[str]) -> None:
    lc = layer_cosines(df)
    iso = bool((df["compare_mode"] == "isolated").any())
    t = Table(title="per-layer cosine (worst over prompts): propagated layer output"
                    + (" | isolated worst probe" if iso else ""), title_justify="left")
    t.add_column("layer")
    for p in pairs:
        t.add_column(f"{p} prop", justify="right")
        if iso:
            t.add_column(f"{p} iso (probe)", justify="right")
    order = [None, *range(len(layer_kinds))]
    for lyr in order:
        name = "embed/head" if lyr is None else f"{lyr} ({layer_kinds[lyr]})"
        cells = []
        for p in pairs:
            row = lc[(lc["pair"] == p) & (lc["layer"].isna() if lyr is None else lc["layer"] == lyr)]
            if row.empty:
                cells += ["—", "—"] if iso else ["—"]
                continue
            r = row.iloc[0]
            cells.append(sig(r["propagated_out_cos"], 6))
            if iso:
                short = str(r["isolated_worst_probe"]).removeprefix(f"layers.{lyr}.")
                cells.append(f"{sig(r['isolated_worst_cos'], 6)} ({short})")
        t.add_row(name, *cells)
    console.print(t)


def selection_table(console: Console, df: pd.DataFrame) -> None:
    s = selection_summary(df)
    if s.empty:
        return
    t = Table(title="selection agreement, propagated (worst over prompts)", title_justify="left")
    labels = {"router_jaccard_min": "router J min", "router_flip_rate": "router flips",
              "router_clear_flip_rate": "clear flips", "hash_route_exact": "hash exact",
              "indexer_topk_overlap_mean": "idx overlap", "indexer_clear_flip_rate": "idx clear",
              "entry_count_match": "entries eq"}
    cols = [c for c in labels if c in s]
    t.add_column("pair")
    t.add_column("layer", justify="right")
    for c in cols:
        t.add_column(labels[c], justify="right")
    for _, r in s.iterrows():
        t.add_row(r["pair"], str(int(r["layer"])), *[sig(r[c], 3) if not pd.isna(r[c]) else "" for c in cols])
    console.print(t)


def columns_table(console: Console, columns: Mapping[str, ColumnResult], verdict: Verdict) -> None:
    """One line per column: its pair, status and first divergence (lines wrap; a table would not fit
    80 columns)."""
    console.print(Text("columns (anchor -> test)", style="italic"))
    for name in COLUMNS:
        col = columns.get(name)
        if col is None:
            continue
        line = Text(f"{name:<11}", style="bold")
        line.append(f"{col.anchor} -> {col.test}  ")
        if not col.ran:
            line.append(f"{'ERROR' if col.error is not None else 'absent'}: {col.reason}",
                        style="bold red" if col.error is not None else "dim")
            console.print(line)
            continue
        ok = verdict.pair_passed(name) and not col.kernels_missing
        line.append("pass" if ok else "FAIL", style="green" if ok else "bold red")
        if name == "floor" and not verdict.floor_is_floor:
            line.append(" (not a floor: the logic column failed)", style="yellow")
        if col.kernels_missing:
            line.append(f"; kernels not run: {col.kernels_missing[0][:160]}", style="red")
        nonfinite = verdict.nonfinite_source(name)
        if nonfinite:   # its own finding: not a logic or kernel divergence
            line.append(f"; {nonfinite}", style="bold magenta")
        d = verdict.first_divergence.get(name)
        if col.audit:
            a, w = col.audit, col.weight_audit
            line.append(f"; kernel audit: {a['calls']} calls, {a['violating_calls']} violating, worst "
                        f"{a['worst_ratio']:.3g} bounds; weights: {w.get('modules', 0)} modules, "
                        f"{len(w.get('mismatching', []))} mismatching")
            line.append(f"; first violation: {d.describe() if d else 'none'}")
            if a["violating_calls"]:
                line.append("; repro files: python -m parity.audit run --backend ...", style="dim")
        else:
            line.append(f"; first divergence (isolated): {d.describe() if d else 'none'}")
        st = col.test_describe.get("streamed")
        if st:   # dsv4.streamed: a model larger than its device, read layer by layer
            line.append(f"; streamed: {len(st['resident_layers'])} of {st['layers']} layers resident, "
                        f"{st['builds']} layer builds ({st['bytes_built'] / 2**30:.3g} GiB) in "
                        f"{st['build_seconds']:.3g} s", style="dim")
        console.print(line)


def rules_report(console: Console, verdict: Verdict, rules: RuleSet, *, limit: int = 25) -> None:
    judged = verdict.judged
    n_fail = int((~judged["passed"]).sum()) if not judged.empty else 0
    exercised = sum(1 for o in verdict.outcomes if o.matched)
    console.print(f"rules {rules.source}: {len(rules.rules)} rules, {exercised} exercised, "
                  f"{len(judged)} judgements, {n_fail} failed")
    failed = verdict.failed_rules
    if failed:
        t = Table(title="failing rules (value at which each would have passed)", title_justify="left")
        for c in ("rule", "failed/matched", "worst", "where", "would pass at"):
            t.add_column(c)
        for o in failed[:limit]:
            w = o.worst_record or {}
            where = f"{w.get('pair')}/{w.get('compare_mode')} {w.get('probe')} prompt {w.get('prompt_id')}"
            t.add_row(escape(o.rule.describe()), f"{o.failed}/{o.matched}", sig(o.worst, 6), escape(where),
                      "none (==)" if o.would_pass_at is None else f"{o.rule.op} {sig(o.would_pass_at, 6)}")
        if len(failed) > limit:
            t.caption = f"{len(failed) - limit} more failing rules in --json"
        console.print(t)
    for msg in verdict.extra_failures:
        console.print(Text(f"FAIL: {msg}", style="bold red"))
    style = "bold green" if verdict.passed else "bold red"
    console.print(Text("PASS" if verdict.passed else "FAIL", style=style))


def error(console: Console, msg: str) -> None:
    console.print(Text(f"error: {msg}", style="bold red"))
