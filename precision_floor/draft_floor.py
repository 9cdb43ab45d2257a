"""Draft floor search: the smallest set of the DSpark draft's plan classes kept in BF16 for the native
draft to meet a budget, the target's plan fixed (docs/dspark.md, "The draft's floor").

The trunk's search (``precision_floor.search``) scores first-token KL of the target; a draft error
never changes the output text (the target verifies every token) and shows only as lost acceptance,
so the draft is scored by draft parity's floor column (``parity.dspark``: reference ``--profile``
<-> native plan on the emulated backend):

* KL(reference || native) of the Markov-corrected draft logits (``dspark.logits``), mean over every
  block row of every prompt (propagated mode: the native draft reads its own target's rows), and
  the rows' top-1 agreement;
* the mean acceptance length τ of native target + native draft against reference target +
  reference draft, over the same prompts (greedy, ``--tokens`` each).

Budget: KL mean <= ``--budget-kl`` and τ(native) >= τ(reference) - ``--budget-tau-drop``. The search
starts with every flippable draft class in FP4 and, as the trunk's ``steepest`` search does,
promotes the class whose promotion lowers the KL most while the budget fails, then reverts every
promoted class that the budget does not need (most bytes first). Every visited plan is printed and
written to ``--out`` (CSV).

``python -m precision_floor.draft_floor [--checkpoint] [--budget-kl X] [--budget-tau-drop Y] [--out CSV]``"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

# The draft classes a flip moves between FP4 and BF16: its linear layers and heads. (The router and
# the drafter's hc head are tiny projections: the default plan keeps them BF16 and so does the search.)
DRAFT_FLIP_CLASSES = ("draft_main_proj", "draft_attn_q", "draft_attn_kv", "draft_attn_o", "draft_shared_expert",
                      "draft_routed_experts", "draft_markov_head", "draft_confidence_head")
DEFAULT_CHECKPOINT = "tiny-trained-dspark"
# Budget defaults for the trained tiny draft (docs/dspark.md gives the measured all-fp4 / all-bf16 points).
DEFAULT_BUDGET_KL = 0.05
DEFAULT_BUDGET_TAU_DROP = 0.05


@dataclass(frozen=True)
class DraftScore:
    bf16: tuple[str, ...]          # the draft classes kept in BF16 (the rest of DRAFT_FLIP_CLASSES: FP4)
    kl: float                      # mean KL of dspark.logits over block rows and prompts
    top1: float                    # mean top-1 agreement of those rows
    tau: float                     # native target + native draft
    tau_reference: float           # reference target + reference draft
    lossless: bool                 # every pair's speculative output equalled its target's plain greedy
    seconds: float

    def meets(self, kl: float, tau_drop: float) -> bool:
        return self.kl <= kl and self.tau >= self.tau_reference - tau_drop


def draft_plan(base: Any, bf16: Sequence[str]) -> Any:
    """``base`` with the flippable draft classes in FP4 except ``bf16``."""
    return base.replace(**{c: ("bf16" if c in bf16 else "fp4") for c in DRAFT_FLIP_CLASSES})


def score_plan(source: Any, prompts: Sequence[Any], base: Any, bf16: Sequence[str], *, profile: str = "bf16",
               n_tokens: int = 16, device: str = "cpu") -> DraftScore:
    """One floor-column run of draft parity for the plan ``draft_plan(base, bf16)``."""
    from parity.dspark.judge import acceptance_checks
    from parity.dspark.run import DraftSpec, rows_frame, run_draft_parity

    t0 = time.time()
    spec = DraftSpec(source=source, prompts=prompts, plan=draft_plan(base, bf16), profile=profile, device=device,
                     n_tokens=n_tokens, columns=("floor",))
    result = run_draft_parity(spec)
    run = result.columns["floor"]
    rows = rows_frame(result)
    logits = rows[(rows.probe == "dspark.logits") & (rows["mode"] == "propagated") & (rows.row >= 0)]

    def tau(pair: str) -> float:
        taus = [t for s in run.spec[pair].values() for t in s.tau]
        return sum(taus) / len(taus)

    # the judge's exact rule (a first difference at a near tie of the target is forgiven), every pair
    lossless = all(c.passed for c in acceptance_checks(result) if c.check == "lossless")
    return DraftScore(tuple(c for c in DRAFT_FLIP_CLASSES if c in bf16),
                      float(logits[logits.metric == "kl"].value.mean()),
                      float(logits[logits.metric == "top1_agree"].value.mean()),
                      tau("test+test"), tau("anchor+anchor"), lossless, time.time() - t0)


def search(score: Callable[[Sequence[str]], DraftScore], kl: float, tau_drop: float,
           weight_bytes: Callable[[str], int], progress: Callable[[DraftScore], None] = lambda s: None
           ) -> tuple[DraftScore | None, list[DraftScore]]:
    """Greedy promotion (lowest KL next) until the budget holds, then add-then-revert (most bytes
    first). Returns the floor (None when even every class in BF16 misses the budget) and every
    visited score."""
    seen: dict[tuple[str, ...], DraftScore] = {}

    def at(bf16: Sequence[str]) -> DraftScore:
        key = tuple(c for c in DRAFT_FLIP_CLASSES if c in bf16)
        if key not in seen:
            seen[key] = score(key)
            progress(seen[key])
        return seen[key]

    cur = at(())
    while not cur.meets(kl, tau_drop):
        rest = [c for c in DRAFT_FLIP_CLASSES if c not in cur.bf16]
        if not rest:
            return None, list(seen.values())
        cur = min((at(cur.bf16 + (c,)) for c in rest), key=lambda s: (s.kl, -s.tau))
    changed = True
    while changed:
        changed = False
        for c in sorted(cur.bf16, key=weight_bytes, reverse=True):
            trial = at(tuple(x for x in cur.bf16 if x != c))
            if trial.meets(kl, tau_drop):
                cur, changed = trial, True
                break
    return cur, list(seen.values())


# Draft weights planned by a class of their own, not by their trunk twin's (dsv4/dspark/build.py).
_DRAFT_OWN = {"main_proj": "draft_main_proj", "markov_head.markov_w2": "draft_markov_head",
              "confidence_head.proj": "draft_confidence_head"}


def draft_class_bytes(config: Any) -> dict[str, int]:
    """Draft class -> the bytes keeping its weights in BF16 costs over FP4 (from the config alone)."""
    from dsv4.checkpoint.names import LINEAR, all_weights, component_class
    from dsv4.probes import draft_class

    from .memory import format_bytes

    out: dict[str, int] = {}
    for s in all_weights(config, mtp=True):
        if s.mtp is None:
            continue
        cls = _DRAFT_OWN.get(s.name) or (draft_class(component_class(s.name)) if s.kind == LINEAR else None)
        if cls in DRAFT_FLIP_CLASSES:
            out[cls] = out.get(cls, 0) + format_bytes("bf16", s.shape) - format_bytes("fp4", s.shape)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m precision_floor.draft_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT,
                   help=f"a DSpark checkpoint (default {DEFAULT_CHECKPOINT}: the trained tiny target with its trained draft)")
    p.add_argument("--plan", default="default", help="the target's plan (its draft classes are searched)")
    p.add_argument("--profile", choices=("bf16", "official"), default="bf16", help="reference profile")
    p.add_argument("--budget-kl", type=float, default=DEFAULT_BUDGET_KL, help="max mean KL of the draft logits (nats)")
    p.add_argument("--budget-tau-drop", type=float, default=DEFAULT_BUDGET_TAU_DROP,
                   help="max drop of the mean acceptance length below the reference draft's")
    p.add_argument("--mode", choices=("chat", "thinking"), default="chat")
    p.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt for τ")
    p.add_argument("--out", default=None, help="CSV of every visited plan (default reports/draft-floor-<checkpoint>.csv)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    from pathlib import Path

    from parity.cli import parse_device, resolve_run_plan, set_threads
    from parity.errors import ParityInputError
    from parity.inputs import encode_prompts, select_prompts
    from parity.source import resolve_checkpoint

    try:
        if not a.budget_kl >= 0 or a.budget_tau_drop < 0 or a.tokens < 1:
            raise ParityInputError(f"budget: expected --budget-kl >= 0, --budget-tau-drop >= 0 and --tokens >= 1, "
                                   f"found {a.budget_kl}, {a.budget_tau_drop}, {a.tokens}")
        device = parse_device(None)
        src = resolve_checkpoint(a.checkpoint)
        if not src.config.dspark_block_size:
            raise ParityInputError(f"checkpoint {a.checkpoint}: expected a DSpark (0731/0813) checkpoint, found "
                                   f"config {src.config_name} without a draft")
        set_threads(a.threads, device, src.config)
        base = resolve_run_plan(a.plan, a.checkpoint)
        prompts = encode_prompts(select_prompts(a.mode), src.tokenizer, src.config.vocab_size)
    except ParityInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    def show(s: DraftScore) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] bf16 {{{', '.join(c.removeprefix('draft_') for c in s.bf16) or '-'}}}: "
              f"KL {s.kl:.4f}, top-1 {s.top1:.3f}, τ {s.tau:.3f} (reference {s.tau_reference:.3f}), "
              f"lossless {s.lossless}, {s.seconds:.0f} s", flush=True)

    print(f"draft floor of {a.checkpoint} ({src.config_name}), target plan {base.name}, reference {a.profile}, "
          f"{len(prompts)} {a.mode} prompts x {a.tokens} tokens; budget KL <= {a.budget_kl:g}, "
          f"τ drop <= {a.budget_tau_drop:g}", flush=True)
    floor, visited = search(lambda bf16: score_plan(src, prompts, base, bf16, profile=a.profile, n_tokens=a.tokens,
                                                    device=device),
                            a.budget_kl, a.budget_tau_drop, lambda c, b=draft_class_bytes(src.config): b.get(c, 0), show)
    out = Path(a.out) if a.out else Path("reports") / f"draft-floor-{Path(str(a.checkpoint)).name}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["bf16_classes,kl_mean,top1_agree,tau_native,tau_reference,lossless,meets_budget"]
    lines += [f"{' '.join(s.bf16)},{s.kl:.6g},{s.top1:.4f},{s.tau:.4f},{s.tau_reference:.4f},{s.lossless},"
              f"{s.meets(a.budget_kl, a.budget_tau_drop)}" for s in visited]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if floor is None:
        print(f"no floor: even every draft class in BF16 misses the budget ({len(visited)} plans, {out})")
        return 1
    print(f"floor: {{{', '.join(floor.bf16) or 'every draft class in FP4'}}} in BF16 (KL {floor.kl:.4f}, "
          f"τ {floor.tau:.3f} vs {floor.tau_reference:.3f}); {len(visited)} plans visited, written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
