"""Is an engine's DSpark acceptance length a bug or what NVFP4 costs? (``python -m parity.dspark
acceptance --counts FILE``; the input format is in docs/dspark.md, "Judging an engine's acceptance").

The engine reports, per prompt, its greedy output tokens and per verify step the number n of draft
tokens it accepted (τ = n + 1). Because greedy speculation is lossless, the output tokens fix every
step's context: the judge replays the engine's own steps with the reference target and the reference
draft (same prompts, same number k of speculative tokens), so each engine step has a **paired**
reference count n_ref at exactly the same context, verified against the same continuation. The
per-step differences d = n - n_ref carry far less noise than two free-running τ's.

Two verdicts, chosen by the dump's ``precision``:

* ``fp32`` (the engine run in FP32 end to end, e.g. a debug build): exact. Every step's count equals
  the reference's unless the first differing draft row is a near tie of the reference draft (top-2
  log-prob margin < 1e-3, the logic pair's constant); with draft logits, every compared row has
  KL(ref || engine) <= 1e-9 nats and the same argmax outside near ties.
* anything else (``nvfp4``, ``bf16``, ...): the floor's τ band, measured on these very steps. Our
  native NVFP4 draft (plan ``default``, emulated) is replayed the same way; its mean paired gap
  ``g_floor`` with standard error ``se_floor`` is what NVFP4 costs here, and the band is
  ``B = |g_floor| + 3 se_floor``. The engine's mean gap g with its paired standard error se is beyond
  the band (a bug) when ``|g| > B + 3 se``. Power: a gap of ``B + (3 + 0.84) se`` is found with 80 %
  probability (one-sided normal approximation over the N paired steps); smaller gaps may pass. With
  draft logits, the engine's worst row KL must stay within 4x the floor draft's worst row on the same
  rows (the draft floor's per-row margin, parity/dspark/calibrate.py) and its top-1 agreement within
  the draft floor's two-sample rate rule.

Compared draft rows stop at the first row where the engine's and the reference's draft tokens differ
(later rows are Markov-corrected from different tokens). A step whose continuation is cut off by the
end of the output before the reference's draft could be verified is left out of the paired counts."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import ParityInputError

FORMAT = "dsv4-parity.acceptance"
FORMAT_VERSION = 1
EXACT_TIE = 1e-3        # nats: the logic pair's near-tie margin (parity/dspark/judge.py)
FLOOR_TIE = 0.1         # nats: the trunk floor's near_tie_logprob
KL_EXACT = 1e-9         # nats: FP32 both sides (parity/dspark/judge.py LOGIC_BOUNDS)
SIGMAS = 3.0
POWER_Z = 0.8416        # one-sided normal quantile of 80 % power
ROW_MARGIN = 4.0        # the draft floor's per-row maxima margin (parity/dspark/calibrate.py)
MEAN_MARGIN = 2.0       # the draft floor's error margin (parity/dspark/calibrate.py MARGIN)


# ---- the input -------------------------------------------------------------------------------------
@dataclass
class PromptCounts:
    prompt_id: str
    prompt_ids: list[int]
    output_tokens: list[int]
    accepted: list[int]
    draft_logits: torch.Tensor | None = None     # [steps, k, V]


@dataclass
class AcceptanceDump:
    engine: str
    k: int
    precision: str
    prompts: list[PromptCounts]
    temperature: float = 0.0
    checkpoint: str = ""


def _need(obj: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ParityInputError(f"{where}: expected a {key!r} field, found fields {sorted(obj)}")
    v = obj[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise ParityInputError(f"{where}: {key}: expected {getattr(kind, '__name__', kind)}, found {v!r}")
    return v


def _ints(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise ParityInputError(f"{where}: expected a list of ints, found {str(v)[:80]}")
    return v


def read_dump(path: str | Path) -> AcceptanceDump:
    """Parse and validate a counts file (JSONL: a header line, then one line per prompt)."""
    p = Path(path)
    if not p.is_file():
        raise ParityInputError(f"--counts: expected a JSONL file, found no file at {p}")
    try:
        lines = [json.loads(s) for s in p.read_text(encoding="utf-8").splitlines() if s.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ParityInputError(f"--counts {p}: expected JSON lines, found {type(e).__name__}: {e}") from None
    if not lines or not isinstance(lines[0], dict):
        raise ParityInputError(f"--counts {p}: expected a header object on the first line, found none")
    h = lines[0]
    if h.get("format") != FORMAT or h.get("format_version") != FORMAT_VERSION:
        raise ParityInputError(f"--counts {p}: expected format {FORMAT!r} version {FORMAT_VERSION}, found "
                               f"{h.get('format')!r} version {h.get('format_version')!r}")
    k = _need(h, "num_speculative_tokens", int, "header")
    if k < 1:
        raise ParityInputError(f"header: num_speculative_tokens: expected >= 1, found {k}")
    temp = float(h.get("temperature", 0.0))
    method = h.get("draft_sample_method", "greedy")
    if temp != 0.0 or method != "greedy":
        raise ParityInputError(f"header: expected greedy speculation (temperature 0, draft_sample_method 'greedy'; "
                               f"this judge replays greedy steps), found temperature {temp}, {method!r}")
    logits = None
    if h.get("draft_logits"):
        from safetensors.torch import load_file

        lp = p.parent / str(h["draft_logits"])
        if not lp.is_file():
            raise ParityInputError(f"header: draft_logits: expected a safetensors file at {lp}, found none")
        logits = load_file(str(lp))
    prompts = []
    for i, line in enumerate(lines[1:], start=2):
        where = f"{p.name} line {i}"
        if not isinstance(line, dict):
            raise ParityInputError(f"{where}: expected an object, found {str(line)[:60]}")
        pid = _need(line, "prompt_id", str, where)
        pc = PromptCounts(pid, _ints(_need(line, "prompt_ids", list, where), where + " prompt_ids"),
                          _ints(_need(line, "output_tokens", list, where), where + " output_tokens"),
                          _ints(_need(line, "accepted", list, where), where + " accepted"))
        bad = [n for n in pc.accepted if not 0 <= n <= k]
        if bad:
            raise ParityInputError(f"{where}: accepted: expected counts in [0, {k}] (num_speculative_tokens), found {bad[:5]}")
        if not pc.prompt_ids or not pc.accepted:
            raise ParityInputError(f"{where}: expected a non-empty prompt and at least one verify step, found "
                                   f"{len(pc.prompt_ids)} prompt tokens, {len(pc.accepted)} steps")
        full = 1 + sum(n + 1 for n in pc.accepted)
        if not full - pc.accepted[-1] - 1 < len(pc.output_tokens) <= full:
            raise ParityInputError(f"{where}: output_tokens: expected {full} tokens (1 from the prefill + n + 1 per "
                                   f"step, the last step possibly cut), found {len(pc.output_tokens)}")
        if logits is not None:
            if pid not in logits:
                raise ParityInputError(f"{where}: draft_logits: expected a tensor {pid!r}, found {sorted(logits)[:5]}")
            t = logits[pid]
            if t.dim() != 3 or t.shape[0] != len(pc.accepted) or t.shape[1] != k:
                raise ParityInputError(f"{where}: draft_logits {pid!r}: expected shape [{len(pc.accepted)}, {k}, V], "
                                       f"found {list(t.shape)}")
            pc.draft_logits = t.to(torch.float32)
        prompts.append(pc)
    if not prompts:
        raise ParityInputError(f"--counts {p}: expected at least one prompt line, found none")
    return AcceptanceDump(str(h.get("engine", "")), k, str(h.get("precision", "nvfp4")), prompts, temp,
                          str(h.get("checkpoint", "")))


def check_servable(dump: AcceptanceDump, config: Any) -> None:
    """Settings the checkpoint cannot serve are bad input (one error): a block drafter proposes at
    most ``dspark_block_size`` tokens, and token ids must be in its vocabulary."""
    gamma = getattr(config, "dspark_block_size", 0) or 0
    if not gamma:
        raise ParityInputError("--checkpoint: expected a DSpark checkpoint (dspark_block_size set), found none")
    if dump.k > gamma:
        raise ParityInputError(f"num_speculative_tokens: expected at most dspark_block_size = {gamma} of this "
                               f"checkpoint, found {dump.k} (the draft proposes one block of {gamma} tokens)")
    for pc in dump.prompts:
        ids = pc.prompt_ids + pc.output_tokens
        if min(ids) < 0 or max(ids) >= config.vocab_size:
            raise ParityInputError(f"prompt {pc.prompt_id}: expected token ids in [0, {config.vocab_size}), found "
                                   f"{min(ids)}..{max(ids)}")
        if pc.draft_logits is not None and pc.draft_logits.shape[2] != config.vocab_size:
            raise ParityInputError(f"prompt {pc.prompt_id}: draft_logits: expected {config.vocab_size} columns, "
                                   f"found {pc.draft_logits.shape[2]}")


# ---- replaying the engine's steps --------------------------------------------------------------------
@dataclass
class Replay:
    """One side replayed on the engine's steps: its accepted count per step (None: cut off), its
    draft logits' first k rows, and the target's disagreements with the engine's output."""

    counts: list[int | None] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    target_mismatch: list[tuple[int, float]] = field(default_factory=list)    # (output index, top-2 margin)


def _margin(row: torch.Tensor) -> float:
    top = torch.topk(torch.log_softmax(row.double(), -1), 2).values
    return float(top[0] - top[1])


def _matched(draft: list[int], cont: list[int]) -> int | None:
    """Accepted count of ``draft`` against the continuation ``cont``; None when ``cont`` ends before
    the draft could be rejected or fully accepted."""
    n = 0
    while n < len(draft) and n < len(cont) and draft[n] == cont[n]:
        n += 1
    return None if n == len(cont) < len(draft) else n


@torch.no_grad()
def replay(side: Any, pc: PromptCounts, k: int) -> Replay:
    """Run ``side`` (a parity.dspark.sides.Side) through the engine's own steps of one prompt."""
    out = Replay()
    logits, mh, state = side.start(torch.tensor(pc.prompt_ids, dtype=torch.int64))
    ds = side.dspark.new_state()
    side.commit(ds, mh)
    o = pc.output_tokens
    if int(torch.argmax(logits[-1])) != o[0]:
        out.target_mismatch.append((0, _margin(logits[-1])))
    p = 1
    for n in pc.accepted:
        anchor = o[p - 1]
        d = side.dspark.draft(ds, anchor)
        out.tokens.append(d.tokens[:k])
        out.logits.append(d.logits[:k].to(torch.float32).cpu())
        out.counts.append(_matched(d.tokens[:k], o[p:p + k]))
        rows = [anchor] + o[p:p + n]
        q, mh = side.extend(state, rows)
        for j in range(len(rows)):
            if p + j < len(o) and int(torch.argmax(q[j])) != o[p + j]:
                out.target_mismatch.append((p + j, _margin(q[j])))
        side.commit(ds, mh)
        p += n + 1
    return out


# ---- statistics -----------------------------------------------------------------------------------
def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("inf")
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def rows_compared(a: list[int], b: list[int]) -> int:
    """Rows 0..r compared, r the first row whose draft tokens differ (its Markov input was still equal)."""
    r = 0
    while r < len(a) and a[r] == b[r]:
        r += 1
    return min(r + 1, len(a))


def row_stats(ref: torch.Tensor, test: torch.Tensor, rows: int, tie: float) -> tuple[list[float], int, int]:
    """Per compared row KL(ref || test) in nats, and (top-1 agreements, rows judged) outside near ties."""
    lr, lt = torch.log_softmax(ref[:rows].double(), -1), torch.log_softmax(test[:rows].double(), -1)
    kl = (lr.exp() * (lr - lt)).sum(-1).clamp_min(0).tolist()
    agree = judged = 0
    for r in range(rows):
        if _margin(ref[r]) < tie:
            continue
        judged += 1
        agree += int(torch.argmax(ref[r]) == torch.argmax(test[r]))
    return kl, agree, judged


@dataclass
class AcceptanceVerdict:
    mode: str                               # "exact" (fp32) or "band"
    steps: int                              # paired steps judged
    tau_engine: float
    tau_reference: float
    gap: float
    se: float
    band: float | None = None               # B (band mode)
    band_origin: str = ""
    tau_floor: float | None = None
    detectable: float | None = None         # the gap found with 80 % power
    count_mismatches: int = 0               # exact mode: steps whose count differs outside near ties
    kl_worst: float | None = None
    kl_bound: float | None = None
    kl_mean: float | None = None
    kl_mean_bound: float | None = None
    top1: tuple[int, int] | None = None     # (agreements, judged)
    top1_bound: float | None = None
    target_mismatches: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["passed"] = self.passed
        return d


def _paired(engine: list[int], refs: list[int | None], others: list[int | None] | None = None
            ) -> tuple[list[int], list[int], list[int]]:
    keep = [i for i, r in enumerate(refs) if r is not None and (others is None or others[i] is not None)]
    return ([engine[i] for i in keep], [refs[i] for i in keep],   # type: ignore[misc]
            [others[i] for i in keep] if others is not None else [])  # type: ignore[misc]


def judge_exact(dump: AcceptanceDump, refs: list[Replay]) -> AcceptanceVerdict:
    eng, ref = [], []
    mism, kl_worst, agree, judged = 0, 0.0, 0, 0
    for pc, rp in zip(dump.prompts, refs):
        for i, (n, r) in enumerate(zip(pc.accepted, rp.counts)):
            if r is None:
                continue
            eng.append(n)
            ref.append(r)
            if n != r and _margin(rp.logits[i][min(n, r)]) >= EXACT_TIE:
                mism += 1
            if pc.draft_logits is not None:
                etok = [int(x) for x in torch.argmax(pc.draft_logits[i], -1)]
                rows = rows_compared(rp.tokens[i], etok)
                kl, a, j = row_stats(rp.logits[i], pc.draft_logits[i], rows, EXACT_TIE)
                kl_worst, agree, judged = max([kl_worst, *kl]), agree + a, judged + j
    g, se = mean_se([a - b for a, b in zip(eng, ref)])
    v = AcceptanceVerdict("exact", len(eng), 1 + sum(eng) / max(len(eng), 1), 1 + sum(ref) / max(len(ref), 1), g, se,
                          count_mismatches=mism, target_mismatches=sum(len(r.target_mismatch) for r in refs))
    if mism:
        v.failures.append(f"{mism} of {len(eng)} steps accepted a different count than the reference draft at the same "
                          f"context (FP32 both sides: identical unless the deciding draft row is a near tie, "
                          f"< {EXACT_TIE:g} nats)")
    if any(pc.draft_logits is not None for pc in dump.prompts):
        v.kl_worst, v.kl_bound, v.top1 = kl_worst, KL_EXACT, (agree, judged)
        if kl_worst > KL_EXACT:
            v.failures.append(f"draft logits: worst row KL(ref || engine) {kl_worst:.3g} nats > {KL_EXACT:g} (FP32 both "
                              f"sides, the logic pair's constant)")
        if agree < judged:
            v.failures.append(f"draft logits: top-1 differs on {judged - agree} of {judged} rows outside near ties (exact)")
    return v


def judge_band(dump: AcceptanceDump, refs: list[Replay], floor: list[Replay]) -> AcceptanceVerdict:
    eng, ref, nat = [], [], []
    kl_e, kl_f, ae, je, af, jf = 0.0, 0.0, 0, 0, 0, 0
    rows_e: list[float] = []
    rows_f: list[float] = []
    for pc, rp, fp in zip(dump.prompts, refs, floor):
        e, r, f = _paired(pc.accepted, rp.counts, fp.counts)
        eng, ref, nat = eng + e, ref + r, nat + f
        if pc.draft_logits is None:
            continue
        for i in range(len(pc.accepted)):
            etok = [int(x) for x in torch.argmax(pc.draft_logits[i], -1)]
            rows = min(rows_compared(rp.tokens[i], etok), rows_compared(rp.tokens[i], fp.tokens[i]))
            kl, a, j = row_stats(rp.logits[i], pc.draft_logits[i], rows, FLOOR_TIE)
            kl_e, ae, je, rows_e = max([kl_e, *kl]), ae + a, je + j, rows_e + kl
            kl, a, j = row_stats(rp.logits[i], fp.logits[i], rows, FLOOR_TIE)
            kl_f, af, jf, rows_f = max([kl_f, *kl]), af + a, jf + j, rows_f + kl
    g, se = mean_se([a - b for a, b in zip(eng, ref)])
    gf, sef = mean_se([a - b for a, b in zip(nat, ref)])
    N = len(eng)
    band = abs(gf) + SIGMAS * sef
    se_eff = se if se > 0 else sef
    v = AcceptanceVerdict("band", N, 1 + sum(eng) / max(N, 1), 1 + sum(ref) / max(N, 1), g, se, band=band,
                          band_origin=(f"our native NVFP4 draft (plan default, emulated) replayed on the same {N} steps: "
                                       f"mean gap {gf:+.4f} ± {sef:.4f} (SE); band = |gap| + {SIGMAS:g} SE"),
                          tau_floor=1 + sum(nat) / max(N, 1), detectable=band + (SIGMAS + POWER_Z) * se_eff,
                          target_mismatches=sum(len(r.target_mismatch) for r in refs))
    if N < 2:
        v.failures.append(f"only {N} paired step(s): at least 2 are needed for a standard error")
    elif abs(g) > band + SIGMAS * se:
        side = "below" if g < 0 else "above"
        v.failures.append(f"τ gap {g:+.4f} per step (engine {v.tau_engine:.3f} vs reference {v.tau_reference:.3f} on "
                          f"the same contexts) is {side} the NVFP4 band ±{band:.4f} by more than {SIGMAS:g} SE "
                          f"({se:.4f}): a bug" + ("" if g < 0 else " or other draft settings than declared"))
    if je or jf:
        v.kl_worst, v.kl_bound = kl_e, ROW_MARGIN * kl_f
        p = (af + 1) / (jf + 2)
        v.top1 = (ae, je)
        v.top1_bound = af / max(jf, 1) - SIGMAS * math.sqrt(p * (1 - p) * (1 / max(jf, 1) + 1 / max(je, 1))) - 0.02
        me, mf = sum(rows_e) / len(rows_e), sum(rows_f) / len(rows_f)
        _, se_d = mean_se([a - b for a, b in zip(rows_e, rows_f)])
        v.kl_mean, v.kl_mean_bound = me, MEAN_MARGIN * mf + SIGMAS * se_d
        if me > v.kl_mean_bound:
            v.failures.append(f"draft logits: mean row KL(ref || engine) {me:.4g} > {MEAN_MARGIN:g} x the NVFP4 floor "
                              f"draft's {mf:.4g} + {SIGMAS:g} SE of the paired row differences ({se_d:.2g}), "
                              f"{len(rows_e)} rows")
        if kl_e > ROW_MARGIN * kl_f:
            v.failures.append(f"draft logits: worst row KL(ref || engine) {kl_e:.3g} > {ROW_MARGIN:g} x the NVFP4 "
                              f"floor draft's worst row {kl_f:.3g} on the same rows")
        if je and ae / je < v.top1_bound:
            v.failures.append(f"draft logits: top-1 agreement {ae}/{je} below {v.top1_bound:.3f} (the floor draft's "
                              f"{af}/{jf} minus 3 two-sample SE minus 0.02)")
    return v


def judge_acceptance(dump: AcceptanceDump, checkpoint: str, *, device: str = "cpu",
                     progress: Callable[[str], None] | None = None) -> AcceptanceVerdict:
    """The one door: validate the settings against the checkpoint, replay the reference (and, in
    band mode, the NVFP4 floor draft) on the engine's steps, judge."""
    from dsv4.plan import PrecisionPlan

    from .sides import native_side, reference_side

    progress = progress or (lambda _m: None)
    from ..source import resolve_checkpoint

    src = resolve_checkpoint(checkpoint, 0)
    check_servable(dump, src.config)
    path, exact = str(src.path), dump.precision == "fp32"
    progress("reference: load")
    ref_side = reference_side(path, profile="bf16", dtype=torch.float32 if exact else torch.bfloat16, device=device)
    refs = []
    for pc in dump.prompts:
        progress(f"reference: replay {pc.prompt_id}")
        refs.append(replay(ref_side, pc, dump.k))
    ref_side.release()
    if exact:
        v = judge_exact(dump, refs)
    else:
        progress("floor: load native NVFP4 draft")
        nat = native_side(path, plan=PrecisionPlan.preset("default"), backend="emulated", device=device)
        floor = []
        for pc in dump.prompts:
            progress(f"floor: replay {pc.prompt_id}")
            floor.append(replay(nat, pc, dump.k))
        v = judge_band(dump, refs, floor)
    if v.target_mismatches:
        v.notes.append(f"{v.target_mismatches} output token(s) differ from the reference target's greedy choice at the "
                       f"same context (the engine's target, not its draft; the draft is judged on the engine's context)")
    return v


def render(console: Any, dump: AcceptanceDump, v: AcceptanceVerdict) -> None:
    steps = sum(len(p.accepted) for p in dump.prompts)
    console.print(f"engine {dump.engine or '?'}: {len(dump.prompts)} prompts, {steps} verify steps, k = {dump.k}, "
                  f"precision {dump.precision} -> {'exact (FP32 both sides)' if v.mode == 'exact' else 'NVFP4 band'} "
                  f"verdict over {v.steps} paired steps")
    console.print(f"  τ engine {v.tau_engine:.3f}   τ reference {v.tau_reference:.3f} (same contexts)   gap "
                  f"{v.gap:+.4f} ± {v.se:.4f} (SE)" + (f"   τ NVFP4 floor {v.tau_floor:.3f}" if v.tau_floor else ""))
    if v.mode == "band":
        console.print(f"  band ±{v.band:.4f}: {v.band_origin}")
        console.print(f"  power: a gap beyond {v.detectable:.4f} per step is found with 80 % probability "
                      f"({SIGMAS:g} SE rule, {v.steps} steps); smaller gaps may pass")
    if v.kl_worst is not None:
        if v.kl_mean is not None:
            console.print(f"  draft logits: mean row KL {v.kl_mean:.4g} (bound {v.kl_mean_bound:.4g})")
        console.print(f"  draft logits: worst row KL {v.kl_worst:.3g} (bound {v.kl_bound:.3g}), top-1 "
                      f"{v.top1[0]}/{v.top1[1]}" + (f" (bound {v.top1_bound:.3f})" if v.top1_bound is not None else ""))
    for n in v.notes:
        console.print(f"  note: {n}")
    for f in v.failures:
        console.print(f"  [red]FAIL[/red] {f}")
    console.print("acceptance: " + ("PASS" if v.passed else "FAIL"))
