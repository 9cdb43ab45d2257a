"""Draft parity, the one door (``run_draft_parity``; CLI ``python -m parity.dspark``): the three
columns of the rest of parity applied to the DSpark draft, and the speculative loop with the
crossed target/draft pairs.

* **logic**      reference bf16 profile in FP32 <-> native ``all-fp32`` on ``emulated``;
* **floor**      reference ``--profile`` <-> native plan on ``emulated`` (what NVFP4 costs the draft);
* **bug_budget** native plan on ``emulated`` <-> the same plan on a kernel backend, judged by the
  exact kernel/weight audit of every target and draft call (absent when no kernel backend runs).

Per column and prompt: one draft call compared probe by probe and row by row (``compare.py``, both
modes), then greedy speculation for the four pairs (anchor/test target × anchor/test draft) and
plain greedy decoding of each target (``loop.py``). Nothing is judged here (``judge.py``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from dsv4.plan import PrecisionPlan

from ..inputs import EncodedPrompt
from ..logits_stats import DEFAULT_NEAR_TIE
from ..selection import DEFAULT_ROUTER_TIE
from ..source import CheckpointSource
from .compare import capture, compare_captures
from .loop import Speculation, greedy, speculate
from .sides import Side, native_side, reference_side

COLUMNS = ("logic", "floor", "bug_budget")
MODES = ("propagated", "isolated")
PAIRS = ("anchor+anchor", "test+test", "anchor+test", "test+anchor")   # target+draft
# what a column does per prompt: the compared draft calls, the speculative pairs, plain greedy decoding
PARTS = ("draft_calls", *PAIRS, "greedy")
Progress = Callable[[str], None]


@dataclass
class DraftSpec:
    source: CheckpointSource
    prompts: Sequence[EncodedPrompt]
    plan: PrecisionPlan = field(default_factory=lambda: PrecisionPlan.preset("default"))
    profile: str = "bf16"
    backend: str = "auto"
    device: str = "cpu"
    device_map: Mapping[Any, str] | None = None
    n_tokens: int = 32
    near_tie: float = 1e-3          # logic and bug-budget rows, and every speculative loop (FP32-scale ties)
    # floor rows: the trunk floor's near_tie_logprob (parity/thresholds/*.toml): BF16-vs-NVFP4 noise
    # moves near-flat rows' argmax (seen on the trained draft's last block rows, KL ~2e-3 nats)
    floor_near_tie: float = DEFAULT_NEAR_TIE
    # floor stages' expert choice: the trunk's router tie margin (parity.selection: BF16-noise flips
    # had relative cut margins up to ~7e-3, NVFP4 ones reach 0.3); logic forgives no flip
    floor_router_tie: float = DEFAULT_ROUTER_TIE
    act_scale: str = "frozen"   # the native sides' activation-scale policy (sides.native_side says why)
    columns: Sequence[str] = COLUMNS
    # tests and the bug zoo replace how a side is built (e.g. a native side with a fault patched in)
    build_side: Callable[..., Side] | None = None
    # a rank of a sharded run (sharded.py) whose prompts do not start with the run's first: its draft
    # calls are replayed first, unjudged, so that frozen activation scales are those of one process
    freeze_prompt: EncodedPrompt | None = None
    # a subset of PARTS (a sharded run splits the costly bug-budget prompts in two; sharded.py): without
    # "draft_calls" the frozen scales must come from ``freeze_prompt``
    parts: Sequence[str] = PARTS


@dataclass
class ColumnRun:
    name: str
    anchor: str
    test: str
    ran: bool
    reason: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)                      # compare_captures rows
    spec: dict[str, dict[str, Speculation]] = field(default_factory=dict)          # pair -> prompt -> run
    greedy: dict[str, dict[str, list[int]]] = field(default_factory=dict)          # anchor/test -> prompt
    audit: dict[str, Any] = field(default_factory=dict)
    weight_audit: dict[str, Any] = field(default_factory=dict)
    parts: tuple[str, ...] = PARTS     # what this run did per prompt (a sharded run's unit may do less)


@dataclass
class DraftParityResult:
    spec: DraftSpec
    columns: dict[str, ColumnRun]


def _sides(spec: DraftSpec, column: str, kernel: str | None) -> tuple[Callable[[], Side], Callable[[], Side]]:
    path, dev, dm = str(spec.source.path), spec.device, spec.device_map
    build = spec.build_side or _build_side
    if column == "logic":
        return (lambda: build("reference", path, profile="bf16", dtype=torch.float32, device=dev, device_map=dm),
                lambda: build("native", path, plan=PrecisionPlan.preset("all-fp32"), backend="emulated", device=dev,
                              device_map=dm, act_scale=spec.act_scale))
    if column == "floor":
        return (lambda: build("reference", path, profile=spec.profile, dtype=torch.bfloat16, device=dev, device_map=dm),
                lambda: build("native", path, plan=spec.plan, backend="emulated", device=dev, device_map=dm,
                              act_scale=spec.act_scale))
    return (lambda: build("native", path, plan=spec.plan, backend="emulated", device=dev, device_map=dm,
                          act_scale=spec.act_scale),
            lambda: build("native", path, plan=spec.plan, backend=kernel, device=dev, device_map=dm,
                          act_scale=spec.act_scale))


def _build_side(kind: str, path: str, **kw: Any) -> Side:
    return reference_side(path, **kw) if kind == "reference" else native_side(path, **kw)


def _stage_bias(source: CheckpointSource) -> Callable[[int], torch.Tensor]:
    """The stored selection-only bias of draft stage s (the anchor sides use it as stored)."""
    return lambda s: source.reader.weight(f"mtp.{s}.ffn.gate.bias").tensors["weight"]


def run_column(spec: DraftSpec, column: str, kernel: str | None, progress: Progress) -> ColumnRun:
    make_anchor, make_test = _sides(spec, column, kernel)
    stage_bias = _stage_bias(spec.source)
    progress(f"{column}: loading both sides")
    anchor, test = make_anchor(), make_test()
    run = ColumnRun(column, anchor.label, test.label, True, parts=tuple(spec.parts))
    c = spec.source.config
    if spec.freeze_prompt is not None:
        progress(f"{column}: replaying {spec.freeze_prompt.id}'s draft calls (frozen scales of one process)")
        _draft_calls(anchor, test, spec.freeze_prompt.tensor())
    floor = column == "floor"
    auditor = None
    if column == "bug_budget":
        from ..audit import CallAuditor, audit_weights

        run.weight_audit = {"target": audit_weights(test.dspark.target).summary(),
                            "draft": audit_weights(test.dspark).summary()}
        auditor = CallAuditor()
        auditor.attach(test.dspark.target)
    try:
        pairs = [q for q in PAIRS if q in spec.parts]
        for n, p in enumerate(spec.prompts):
            ids = p.tensor()
            if auditor is not None:
                auditor.prompt_id = p.id
            if "draft_calls" in spec.parts:
                progress(f"{column}: prompt {n + 1}/{len(spec.prompts)} {p.id}: draft call")
                a, tests = _draft_calls(anchor, test, ids)
                for mode, t in tests.items():
                    for row in compare_captures(a, t, n_layers=c.num_hidden_layers, stages=c.dspark_stages,
                                                near_tie=spec.floor_near_tie if floor else spec.near_tie,
                                                router_tie=spec.floor_router_tie if floor else 0.0,
                                                router_bias=stage_bias, common_experts=floor):
                        run.rows.append({"column": column, "mode": mode, "prompt": p.id, "prompt_mode": p.mode,
                                         **row})
            if spec.n_tokens <= 0:   # calibration: the draft calls only
                continue
            sides = {"anchor": anchor, "test": test}
            if pairs:
                progress(f"{column}: prompt {n + 1}/{len(spec.prompts)} {p.id}: speculation, {len(pairs)} pairs")
            for pair in pairs:
                tgt, drf = pair.split("+")
                run.spec.setdefault(pair, {})[p.id] = speculate(sides[tgt], sides[drf], ids, spec.n_tokens)
            if "greedy" in spec.parts:
                for name, side in sides.items():
                    run.greedy.setdefault(name, {})[p.id] = greedy(side, ids, spec.n_tokens)
    finally:
        if auditor is not None:
            auditor.detach()
            run.audit = auditor.summary()
    anchor.release()
    test.release()
    return run


def _draft_calls(anchor: Side, test: Side, ids: torch.Tensor) -> tuple[Any, dict[str, Any]]:
    """A prompt's three draft calls, in this order (the first calls of a column set its frozen scales)."""
    a = capture(anchor, ids)
    return a, {"propagated": capture(test, ids, anchor_token=a.anchor_token, forced=a.tokens),
               "isolated": capture(test, ids, main_hidden=a.main_hidden, anchor_token=a.anchor_token,
                                   forced=a.tokens)}


def rows_frame(result: DraftParityResult) -> Any:
    """Every compared row of the run as a DataFrame (the judge aggregates it)."""
    import pandas as pd

    rows = [r for run in result.columns.values() for r in run.rows]
    cols = ["column", "mode", "prompt", "prompt_mode", "probe", "place", "component", "row", "metric", "value"]
    return pd.DataFrame(rows, columns=cols)


def run_draft_parity(spec: DraftSpec, progress: Progress | None = None) -> DraftParityResult:
    """Run the requested columns (one at a time, both sides of a column loaded together)."""
    from ..threeway import resolve_kernel_backend

    progress = progress or (lambda _m: None)
    bad = [c for c in spec.columns if c not in COLUMNS]
    if bad:
        from ..errors import ParityInputError

        raise ParityInputError(f"columns: expected a subset of {list(COLUMNS)}, found {bad}")
    bad = [q for q in spec.parts if q not in PARTS]
    if bad or not spec.parts or ("draft_calls" not in spec.parts and spec.freeze_prompt is None):
        from ..errors import ParityInputError

        raise ParityInputError(f"parts: expected a non-empty subset of {list(PARTS)}, with a freeze_prompt when "
                               f"'draft_calls' is left out (its calls set the frozen scales), found "
                               f"{list(spec.parts)} (freeze_prompt {getattr(spec.freeze_prompt, 'id', None)})")
    if not spec.source.config.dspark_block_size:
        from ..errors import ParityInputError

        raise ParityInputError(f"checkpoint {spec.source.spec}: expected a DSpark (0731/0813) checkpoint with "
                               f"dspark_* config keys and mtp.* stages, found config {spec.source.config_name} "
                               f"without them (try --checkpoint tiny-dspark)")
    kernel, reason = resolve_kernel_backend(spec.backend, spec.device) if "bug_budget" in spec.columns \
        else (None, "not requested")
    out: dict[str, ColumnRun] = {}
    for column in spec.columns:
        if column == "bug_budget" and kernel is None:
            out[column] = ColumnRun(column, f"native:{spec.plan.name}/emulated", "native:<kernel>", False, reason)
            continue
        out[column] = run_column(spec, column, kernel, progress)
    return DraftParityResult(spec, out)
