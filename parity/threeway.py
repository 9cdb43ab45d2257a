"""The three columns (docs/methods.md §5), each a pair of models compared per probe and on logits:

* **logic**      = reference ``bf16`` profile in FP32 <-> native ``all-fp32`` plan, ``emulated`` backend.
  Both sides compute everything in FP32 (weights dequantized exactly, FP32 activations), so they agree
  to ~1e-13 rel_diff and any layer bug stands orders of magnitude above that, with no BF16 rounding
  or near-tie selection flip to hide behind. Always anchored by the ``bf16`` reference profile (no
  activation fake quantization), whatever ``--profile`` says.
* **floor**      = reference (``--profile``) <-> native with the chosen plan on ``emulated``: what
  NVFP4 costs. Only a floor when the logic column passes (see :mod:`parity.verdict`).
* **bug_budget** = native plan on ``emulated`` <-> the same plan on a kernel backend: should be ~0.
  Absent, with the reason, when no kernel backend executes on the device (always on CPU).

Models are built one at a time and released before the next, so peak memory is one model plus
probes on the host. Each column runs both compare modes: propagated and isolated (the test side's
layer ``i`` fed the anchor's input to layer ``i``; for bug_budget the anchor is the emulated run).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from dsv4.kernels.registry import BackendError, available_backends, resolve_backend
from dsv4.plan import PrecisionPlan
from dsv4.streamed import is_streamed

from .compare import CompareSettings, Where, compare_probes
from .env import code_version, device_name, versions
from .errors import ParityInputError
from .inputs import EncodedPrompt
from .logits_stats import FIRST_PREFIX, PositionStats, summarize
from .fit_check import check_native_fits
from .layer_major_column import run_prompts_layer_major
from .probe_home import anchor_on_device, fits_on_device, is_on_device, probe_bytes, run_with_home, to_host
from .records import ALL_PROMPTS, COMPARE_MODES, RunContext, new_run_id
from .refcache import ReferenceCache, cache_key, dtype_name
from .rules import RuleSet
from .runner import DefaultLoaders, ModelLoaders, SideOutput, free_memory, run_isolated, run_propagated
from .source import CheckpointSource

from .constants import COLUMNS  # noqa: E402  (the pairs, in report order)
EMULATED = "emulated"
LOGIC_PLAN = "all-fp32"
LOGIC_PROFILE = "bf16"
LOGIC_REF_DTYPE = torch.float32
# progress(description, done, total): called as work advances (the CLI draws rich progress bars).
Progress = Callable[[str, int, int], None]


@dataclass
class RunSpec:
    source: CheckpointSource
    prompts: Sequence[EncodedPrompt]
    plan: PrecisionPlan = field(default_factory=lambda: PrecisionPlan.preset("default"))
    backend: str = "auto"
    profile: str = "bf16"
    device: str = "cpu"
    device_map: Mapping[Any, str] | None = None
    ref_dtype: torch.dtype = torch.bfloat16
    settings: CompareSettings = field(default_factory=CompareSettings)
    reference_cache: Path | None = None
    columns: Sequence[str] = COLUMNS
    modes: Sequence[str] = COMPARE_MODES
    fault: str | None = None
    run_id: str = field(default_factory=new_run_id)


@dataclass
class ForwardTime:
    column: str
    side: str        # "reference:<profile>", "native:<plan>/<backend>"
    prompt_id: str
    mode: str        # propagated | isolated | cached
    seconds: float
    tokens: int


@dataclass
class ColumnResult:
    name: str
    anchor: str
    test: str
    ran: bool
    reason: str = ""
    load_seconds: float = 0.0
    test_describe: dict[str, Any] = field(default_factory=dict)
    # prompt id -> (anchor logits, test logits) at the first-token position, fp32 [V]
    last_logits: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    kernels_missing: list[str] = field(default_factory=list)
    # bug_budget only: the kernel audit (parity.audit): per-call summary, weight audit summary, and the
    # violating calls with their operands (for `python -m parity.audit` repros)
    audit: dict[str, Any] = field(default_factory=dict)
    weight_audit: dict[str, Any] = field(default_factory=dict)
    # wall seconds outside the forwards, by phase: weight_audit, compare (probe metrics), audit_records;
    # audit_replay is inside the forwards (each kernel call replayed through the oracle as it is made)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    audit_kept: list[Any] = field(default_factory=list, repr=False)
    # the exception that stopped this column (the others still ran); ran is False then
    error: BaseException | None = field(default=None, repr=False)
    # compare mode -> (prompt index in the run, its position statistics), in prompt order: what the
    # run-level logits aggregates are computed from (parity.distributed merges prompt shards with them)
    position_stats: dict[str, list[tuple[int, PositionStats]]] = field(default_factory=dict, repr=False)


@dataclass
class ThreeWayResult:
    spec: RunSpec
    records: list[dict[str, Any]]
    columns: dict[str, ColumnResult]
    forwards: list[ForwardTime]
    reference_load_seconds: float = 0.0
    cache_hits: int = 0

    @property
    def column_errors(self) -> dict[str, BaseException]:
        return {n: c.error for n, c in self.columns.items() if c.error is not None}

    def raise_errors(self) -> "ThreeWayResult":
        """For callers that need every column (the zoo, calibration, the floor studies): re-raise the
        first column's exception, as if the columns were not isolated."""
        for err in self.column_errors.values():
            raise err
        return self


def settings_from_rules(rules: RuleSet, per_token: bool = False) -> CompareSettings:
    return CompareSettings(near_tie=rules.setting("near_tie_logprob"), router_tie=rules.setting("router_tie_margin"),
                           indexer_tie=rules.setting("indexer_tie_margin"), per_token=per_token)


def resolve_kernel_backend(requested: str, device: str) -> tuple[str | None, str]:
    """(kernel backend name, reason when None). ``auto`` picks the highest-priority non-emulated
    backend that executes on ``device``; an explicit name must exist and execute there (else a
    bad-input error)."""
    if requested == EMULATED:
        return None, "backend 'emulated' requested: no kernel backend to compare against"
    try:
        return resolve_backend(requested, device, exclude=(EMULATED,)).name, ""
    except BackendError as e:
        if requested != "auto":
            raise ParityInputError(f"backend: {e}") from None
    others = sorted(n for n in available_backends() if n != EMULATED)
    listed = f" (registered: {', '.join(others)})" if others else ""
    return None, f"no kernel backend executes on {torch.device(device).type}{listed}"


def run_context(spec: RunSpec, *, plan: str, profile: str, backend: str) -> RunContext:
    """The record fields shared by one measured pair of ``spec``."""
    src = spec.source
    return RunContext(run_id=spec.run_id, code_version=code_version(), checkpoint_fingerprint=src.fingerprint,
                      config_name=src.config_name, plan=plan, profile=profile, backend=backend,
                      device=device_name(spec.device), versions=versions(), seed=src.seed, fault=spec.fault)


def set_mode_of(prompts: Sequence[EncodedPrompt]) -> str:
    """prompt_mode of run-level aggregates: the prompts' common mode, or 'mixed'."""
    modes = {p.mode for p in prompts}
    return modes.pop() if len(modes) == 1 else "mixed"


class _Runner:
    def __init__(self, spec: RunSpec, loaders: ModelLoaders, progress: Progress | None) -> None:
        self.spec, self.loaders = spec, loaders
        self.progress = progress or (lambda *_: None)
        self.cache = ReferenceCache(spec.reference_cache) if spec.reference_cache else None
        self.refs: dict[str, list[SideOutput]] = {}
        self.forwards: list[ForwardTime] = []
        self.records: list[dict[str, Any]] = []
        self.ref_load_seconds = 0.0
        self.kept_model: Any = None    # the floor column's model, for the bug-budget column to reuse

    # ---- the reference side ---------------------------------------------------------------------
    def reference(self, profile: str, dtype: torch.dtype | None = None) -> list[SideOutput]:
        spec, src = self.spec, self.spec.source
        dtype = dtype or spec.ref_dtype
        if (profile, dtype) in self.refs:
            return self.refs[(profile, dtype)]
        keys = [cache_key(src.fingerprint, profile, dtype_name(dtype), p.ids) for p in spec.prompts]
        outs: list[SideOutput | None] = [self.cache.load(k) if self.cache else None for k in keys]
        model = None
        label = f"reference:{profile}" + ("" if dtype == torch.bfloat16 else f"/{dtype_name(dtype)}")
        todo = [n for n, o in enumerate(outs) if o is None]
        computed: dict[int, SideOutput] = {}
        if todo:
            self.progress(f"load {label}", 0, 1)
            t0 = _now()
            model = self.loaders.reference(str(src.path), profile=profile, dtype=dtype,
                                           device=spec.device, device_map=spec.device_map)
            self.ref_load_seconds += _now() - t0
            self.progress(f"load {label}", 1, 1)
        if todo and getattr(getattr(model, "store", None), "cache", True) is False:
            # it reads every layer from the checkpoint on every forward: every prompt layer by layer instead,
            # so each layer is read once (its later prompts find it in the page cache)
            got = run_prompts_layer_major(
                model, [spec.prompts[n].tensor() for n in todo], None, num_layers=src.config.num_hidden_layers,
                device=spec.device, modes=(), compare=None, keep=True, host=True,
                progress=lambda i, n: self.progress(f"{label} layer by layer", i, n))
            computed = {n: po.out for n, po in zip(todo, got)}
        for n, (p, key) in enumerate(zip(spec.prompts, keys)):
            self.progress(f"{label} forward", n, len(spec.prompts))
            if outs[n] is not None:
                self.forwards.append(ForwardTime("reference", label, p.id, "cached", 0.0, p.n_tokens))
                continue
            out = computed.get(n) or run_propagated(model, p.tensor(), spec.device)
            self.forwards.append(ForwardTime("reference", label, p.id, "propagated", out.seconds["forward"],
                                             p.n_tokens))
            if self.cache:
                self.cache.store(key, out, prompt_id=p.id, fingerprint=src.fingerprint, profile=profile, ids=p.ids)
            outs[n] = out
        self.progress(f"{label} forward", len(spec.prompts), len(spec.prompts))
        model = None
        free_memory(self.spec.device)
        self.refs[(profile, dtype)] = [o for o in outs if o is not None]
        return self.refs[(profile, dtype)]

    # ---- one column ----------------------------------------------------------------------------------
    def column(self, name: str, anchors: Sequence[SideOutput], *, plan: PrecisionPlan, backend: str,
               anchor_label: str, profile: str, keep_outputs: bool = False) -> tuple[ColumnResult, list[SideOutput]]:
        """One column's forwards and comparisons. ``keep_outputs``: its outputs (and its model) are the next
        column's anchors (and, through ``loaders.rebackend``, its model on the kernel backend)."""
        spec = self.spec
        label = f"native:{plan.name}/{backend}"
        self.progress(f"load {label}", 0, 1)
        t0 = _now()
        model = self._load_native(plan, backend, anchors)
        result = ColumnResult(name, anchor_label, label, True, load_seconds=_now() - t0,
                              test_describe=dict(getattr(model, "describe", dict)()))
        self.progress(f"load {label}", 1, 1)
        if getattr(model, "fingerprint", spec.source.fingerprint) != spec.source.fingerprint:
            raise ParityInputError(f"{label}: loaded checkpoint fingerprint {model.fingerprint} differs from "
                                   f"{spec.source.fingerprint}")
        ctx = run_context(spec, plan=plan.name, profile=profile, backend=backend)
        stats: dict[str, list[tuple[int, PositionStats]]] = {m: [] for m in spec.modes}
        kept: list[SideOutput] = []
        auditor = None
        if backend != EMULATED:   # the bug-budget column is judged by the exact kernel audit
            auditor = self._audit_begin(model, ctx, name, result)
        forwards = self._layer_major if is_streamed(model) else self._prompt_major   # parity.layer_major_column
        forwards(name, model, anchors, ctx, stats, kept, result, auditor, keep_outputs)
        self.progress(f"{name}: {label} forward", len(spec.prompts), len(spec.prompts))
        result.position_stats = stats
        self.records += aggregate_records(spec, ctx, name, {m: [st for _, st in v] for m, v in stats.items()})
        if backend != EMULATED:
            result.kernels_missing = _kernels_missing(model)
        if is_streamed(model):       # dsv4.streamed: what its forwards built and kept, after them
            result.test_describe["streamed"] = model.blocks.stats()
        if auditor is not None:
            self._audit_end(auditor, ctx, name, result)
        if keep_outputs:
            self.kept_model = model
        model = None
        free_memory(self.spec.device)
        return result, kept

    def _prompt_major(self, name: str, model: Any, anchors: Sequence[SideOutput], ctx: RunContext,
                      stats: dict[str, list[tuple[int, PositionStats]]], kept: list[SideOutput], result: ColumnResult,
                      auditor: Any, keep_outputs: bool) -> None:
        """The column's forwards and comparisons, prompt by prompt (a model whose layers stay built)."""
        spec, label, L = self.spec, result.test, self.spec.source.config.num_hidden_layers
        for n, (p, anchor) in enumerate(zip(spec.prompts, anchors)):
            self.progress(f"{name}: {label} forward", n, len(spec.prompts))
            ids = p.tensor()
            if auditor is not None:
                auditor.prompt_id = p.id
            # a host anchor goes up once for this prompt when it fits beside the test side's probes
            up = anchor_on_device(anchor.probes, spec.device)
            if up is not None:
                anchor = SideOutput(up, anchor.streams, anchor.seconds)
            # the test side's probes stay on the GPU when they fit (compared there, then dropped)
            home = fits_on_device(probe_bytes(anchor.probes), spec.device)
            out, home = self._forward(lambda d: run_propagated(model, ids, spec.device, probes_on_device=d), home,
                                      auditor)
            self.forwards.append(ForwardTime(name, label, p.id, "propagated", out.seconds["forward"], p.n_tokens))
            tests = {"propagated": out.probes}
            if "isolated" in spec.modes:
                (tests["isolated"], secs), _ = self._forward(
                    lambda d: run_isolated(model, ids, anchor, L, spec.device, probes_on_device=d), home, auditor)
                self.forwards.append(ForwardTime(name, label, p.id, "isolated", secs, p.n_tokens))
            t_cmp = _now()
            for mode in spec.modes:
                where = Where(ctx, name, mode, p.id, p.mode)
                recs, st = compare_probes(anchor.probes, tests[mode], where=where, config=spec.source.config,
                                          ids=ids, router_bias=spec.source.router_bias, settings=spec.settings,
                                          device=spec.device)
                self.records += recs
                if st is not None:
                    stats[mode].append((n, st))
            _add(result.phase_seconds, "compare", _now() - t_cmp)
            result.last_logits[p.id] = (anchor.logits[-1].float().cpu(), out.logits[-1].float().cpu())
            del tests, anchor
            if keep_outputs:   # a later column's anchor: left on the GPU while the kept ones fit there
                if home and not fits_on_device(sum(probe_bytes(k.probes) for k in (*kept, out)), spec.device):
                    out = SideOutput(to_host(out.probes), out.streams, out.seconds)
                kept.append(out)

    def _layer_major(self, name: str, model: Any, anchors: Sequence[SideOutput], ctx: RunContext,
                     stats: dict[str, list[tuple[int, PositionStats]]], kept: list[SideOutput], result: ColumnResult,
                     auditor: Any, keep_outputs: bool) -> None:
        """The column's forwards and comparisons for a streamed model, every prompt layer by layer."""
        spec, prompts = self.spec, self.spec.prompts
        label = result.test

        def compare(n: int, mode: str, probes: dict, only: Any) -> Any:
            p = prompts[n]
            return compare_probes(anchors[n].probes, probes, where=Where(ctx, name, mode, p.id, p.mode),
                                  config=spec.source.config, ids=p.tensor(), router_bias=spec.source.router_bias,
                                  settings=spec.settings, only=only, device=spec.device)

        def on_prompt(n: int) -> None:
            if auditor is not None:
                auditor.prompt_id = prompts[n].id

        outs = run_prompts_layer_major(
            model, [p.tensor() for p in prompts], anchors, num_layers=spec.source.config.num_hidden_layers,
            device=spec.device, modes=spec.modes, compare=compare, keep=keep_outputs, on_prompt=on_prompt,
            progress=lambda i, n: self.progress(f"{name}: {label} layer by layer", i, n))
        for n, (p, anchor, po) in enumerate(zip(prompts, anchors, outs)):
            for mode in po.seconds:     # propagated always (its logits), isolated when compared
                self.forwards.append(ForwardTime(name, label, p.id, mode, po.seconds[mode], p.n_tokens))
            self.records += po.records
            for mode, st in po.stats.items():
                stats[mode].append((n, st))
            _add(result.phase_seconds, "compare", po.compare_seconds)
            result.last_logits[p.id] = (anchor.logits[-1].float().cpu(), po.out.logits[-1].float().cpu())
            if keep_outputs:
                kept.append(po.out)

    def _load_native(self, plan: PrecisionPlan, backend: str, anchors: Sequence[SideOutput]) -> Any:
        """The native model; if it does not fit beside anchors left on the GPU, they move to the host
        and it is built again."""
        spec = self.spec

        def load() -> Any:
            return self.loaders.native(str(spec.source.path), plan=plan, backend=backend, device=spec.device,
                                       device_map=spec.device_map)

        kept, self.kept_model = self.kept_model, None
        if kept is not None:
            # the floor column's model (same plan) on the kernel backend: one build from the checkpoint, not two
            rebackend = getattr(self.loaders, "rebackend", None)
            same_plan = getattr(getattr(kept, "plan", None), "key", lambda: None)() == plan.key()
            reused = rebackend(kept, backend) if rebackend is not None and same_plan else None
            if reused is not None:
                return reused
            kept = None
            free_memory(spec.device)
        if not any(is_on_device(a.probes) for a in anchors):
            return load()
        try:
            return load()
        except torch.cuda.OutOfMemoryError:
            pass     # out of the except block first: its traceback holds the half-built model
        for a in anchors:
            a.probes = to_host(a.probes)
        free_memory(spec.device)
        return load()

    def _forward(self, run: Callable[[bool], Any], on_device: bool, auditor: Any) -> tuple[Any, bool]:
        """``run(on_device)`` through ``probe_home.run_with_home``: a forward run again with its probes on
        the host forgets the calls its abandoned attempt audited."""
        snap = auditor.snapshot() if auditor is not None else None

        def release() -> None:
            if auditor is not None:
                auditor.restore(snap)
            free_memory(self.spec.device)

        return run_with_home(run, on_device, release)

    def _audit_begin(self, model: Any, ctx: RunContext, pair: str, result: ColumnResult) -> Any:
        """Weight audit first (what the kernel reads for every NVFP4 weight), then a tap that audits
        every kernel call of the forwards that follow."""
        from .audit import CallAuditor, audit_weights, weight_records

        self.progress(f"{pair}: weight audit", 0, 1)
        t0 = _now()
        wa = audit_weights(model, progress=lambda i, n: self.progress(f"{pair}: weight audit", i, n))
        result.weight_audit = wa.summary()
        self.records += weight_records(wa, ctx, pair, set_mode_of(self.spec.prompts))
        _add(result.phase_seconds, "weight_audit", _now() - t0)
        auditor = CallAuditor()
        auditor.attach(model)     # detached in _audit_end; on an error the model is dropped with its taps
        return auditor

    def _audit_end(self, auditor: Any, ctx: RunContext, pair: str, result: ColumnResult) -> None:
        auditor.detach()
        t0 = _now()
        modes = {p.id: p.mode for p in self.spec.prompts}
        self.records += auditor.records(ctx, modes, pair)
        _add(result.phase_seconds, "audit_records", _now() - t0)
        _add(result.phase_seconds, "audit_replay", auditor.replay_seconds)
        result.audit = auditor.summary()
        result.audit_kept = list(auditor.kept)


def aggregate_records(spec: RunSpec, ctx: RunContext, pair: str,
                      stats: Mapping[str, Sequence[PositionStats]]) -> list[dict[str, Any]]:
    """The run-level logits records of one column (prompt_id ``*``): the statistics over every
    teacher-forced position of every prompt and over the first-token positions."""
    mode_of_set = set_mode_of(spec.prompts)
    out: list[dict[str, Any]] = []
    for mode, parts in stats.items():
        if not parts:
            continue
        where = Where(ctx, pair, mode, ALL_PROMPTS, mode_of_set)
        every = PositionStats.concat(list(parts))
        firsts = PositionStats.concat([s.select(slice(s.n - 1, s.n)) for s in parts])
        for metric, v in {**summarize(every), **summarize(firsts, FIRST_PREFIX)}.items():
            out.append(where.rec("logits", metric, v))
        out.append(where.rec("logits", "near_tie_threshold", spec.settings.near_tie))
    return out


def _kernels_missing(model: Any) -> list[str]:
    """Code-path assertion (docs/methods.md §9): FP4 modules that never reached the kernel backend."""
    check = getattr(model, "assert_kernels_ran", None)
    if check is None:
        return []
    try:
        check()
    except AssertionError as e:
        return [str(e)]
    return []


def _add(d: dict[str, float], key: str, seconds: float) -> None:
    d[key] = d.get(key, 0.0) + seconds


def _now() -> float:
    return time.perf_counter()


def logic_anchor_label() -> str:
    """The logic column's anchor: the reference's bf16 profile computed in FP32."""
    return f"reference:{LOGIC_PROFILE}/{dtype_name(LOGIC_REF_DTYPE)}"


def run_reference(spec: RunSpec, profile: str, loaders: ModelLoaders | None = None,
                  progress: Progress | None = None, pair: str = "floor") -> tuple[list[SideOutput], list[ForwardTime]]:
    """The reference's outputs for ``spec.prompts`` (through the reference cache when configured), as
    the anchor of ``pair``: the logic pair's anchor is the bf16 profile computed in FP32."""
    r = _Runner(spec, loaders or DefaultLoaders(), progress)
    if pair == "logic":
        return r.reference(LOGIC_PROFILE, LOGIC_REF_DTYPE), r.forwards
    return r.reference(profile), r.forwards


def run_threeway(spec: RunSpec, loaders: ModelLoaders | None = None,
                 progress: Progress | None = None) -> ThreeWayResult:
    """Run the requested columns and return every record (nothing is judged here)."""
    bad = [c for c in spec.columns if c not in COLUMNS]
    if bad:
        raise ParityInputError(f"columns: expected a subset of {list(COLUMNS)}, found {bad}")
    bad_modes = [m for m in spec.modes if m not in COMPARE_MODES]
    if bad_modes or not spec.modes:
        raise ParityInputError(f"compare modes: expected a non-empty subset of {list(COMPARE_MODES)}, found "
                               f"{list(spec.modes)}")
    # the native models are built whole: one that cannot fit its GPUs stops here, not after the reference
    # (judged for the project's own models; loaders of one's own may build something else)
    if loaders is None or isinstance(loaders, DefaultLoaders):
        check_native_fits(spec.source.config, spec.plan, spec.columns, spec.device, spec.device_map)
    kernel, reason = resolve_kernel_backend(spec.backend, spec.device) if "bug_budget" in spec.columns \
        else (None, "not requested")
    r = _Runner(spec, loaders or DefaultLoaders(), progress)
    columns: dict[str, ColumnResult] = {}

    def isolated(name: str, anchor: str, test: str, run: Any) -> tuple[ColumnResult, list[SideOutput]]:
        # One column's failure (a crash, non-finite scales a kernel refuses) must not take the others'
        # results with it: it becomes that column's result; bad input still stops the run.
        try:
            return run()
        except (ParityInputError, KeyboardInterrupt):
            raise
        except Exception as e:   # noqa: BLE001 - reported per column, re-raised by raise_errors()
            return ColumnResult(name, anchor, test, False, f"error: {type(e).__name__}: {e}", error=e), []

    if "logic" in spec.columns:
        anchor = logic_anchor_label()
        columns["logic"], _ = isolated("logic", anchor, f"native:{LOGIC_PLAN}/{EMULATED}", lambda: r.column(
            "logic", r.reference(LOGIC_PROFILE, LOGIC_REF_DTYPE), plan=PrecisionPlan.preset(LOGIC_PLAN),
            backend=EMULATED, anchor_label=anchor, profile=LOGIC_PROFILE))
    floor_outputs: list[SideOutput] = []
    if "floor" in spec.columns or kernel is not None:
        columns["floor"], floor_outputs = isolated(
            "floor", f"reference:{spec.profile}", f"native:{spec.plan.name}/{EMULATED}", lambda: r.column(
                "floor", r.reference(spec.profile), plan=spec.plan, backend=EMULATED,
                anchor_label=f"reference:{spec.profile}", profile=spec.profile, keep_outputs=kernel is not None))
    if "bug_budget" in spec.columns:
        anchor, test = f"native:{spec.plan.name}/{EMULATED}", f"native:{spec.plan.name}/{kernel or '<kernel>'}"
        if kernel is None:
            columns["bug_budget"] = ColumnResult("bug_budget", anchor, test, False, reason)
        elif not columns["floor"].ran:
            columns["bug_budget"] = ColumnResult("bug_budget", anchor, test, False,
                                                 "not run: its emulated anchor (the floor column) failed")
        else:
            columns["bug_budget"], _ = isolated("bug_budget", anchor, test, lambda: r.column(
                "bug_budget", floor_outputs, plan=spec.plan, backend=kernel, anchor_label=anchor,
                profile=spec.profile))
    return ThreeWayResult(spec, r.records, columns, r.forwards, r.ref_load_seconds,
                          r.cache.hits if r.cache else 0)


__all__ = ["COLUMNS", "RunSpec", "ThreeWayResult", "ColumnResult", "ForwardTime", "run_threeway", "run_reference",
           "resolve_kernel_backend", "settings_from_rules", "run_context", "set_mode_of", "aggregate_records"]
