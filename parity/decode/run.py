"""The decode runs: the reference on every prompt, then the native model (one model at a time, like
:mod:`parity.threeway`), and the per-prompt analysis (statistics, divergence, degeneration)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from dsv4.decode.loop import DecodeInputError, MemoryMeter, Sampler, Step, check_request, greedy, model_devices, \
    run_steps
from dsv4.plan import PrecisionPlan

from ..compare import CompareSettings
from ..degeneration import DegenerationReport, analyze
from ..errors import ParityInputError
from ..inputs import EncodedPrompt
from ..logits_stats import PositionStats, position_stats
from ..records import new_run_id
from ..runner import DefaultLoaders, ModelLoaders, free_memory
from ..source import CheckpointSource
from ..threeway import LOGIC_PLAN, LOGIC_PROFILE, LOGIC_REF_DTYPE

from ..constants import DEFAULT_MUTUAL_TOPK, DEFAULT_TOKENS  # noqa: E402,F401  (re-exported)



@dataclass
class DecodeSpec:
    source: CheckpointSource
    prompts: Sequence[EncodedPrompt]
    plan: PrecisionPlan
    mode: str = "teacher_forced"              # teacher_forced | free
    tokens: int = DEFAULT_TOKENS
    forced: str | list[int] = "greedy"        # greedy | sample | explicit ids (teacher-forced only)
    temperature: float = 1.0
    sample_seed: int = 0
    probe_steps: str | list[int] = "auto"
    backend: str = "auto"
    profile: str = "bf16"
    device: str = "cpu"
    device_map: dict[Any, str] | None = None
    ref_dtype: torch.dtype = torch.bfloat16
    settings: CompareSettings = field(default_factory=CompareSettings)
    mutual_topk: int = DEFAULT_MUTUAL_TOPK
    graphs: bool = False                      # native decode steps through dsv4.decode.graphs.GraphDecoder
    run_id: str = field(default_factory=new_run_id)

    @property
    def pair(self) -> str:
        """``logic`` for the all-fp32 plan against the bf16-profile reference in FP32, else ``floor``."""
        return ("logic" if self.plan.name == LOGIC_PLAN and self.profile == LOGIC_PROFILE
                and self.ref_dtype == LOGIC_REF_DTYPE else "floor")


@dataclass
class SideRun:
    """One model's steps on one prompt."""

    logits: torch.Tensor                      # [N, V] fp32
    targets: list[int]                        # c_s: forced, or this side's own choice
    fed: list[int | None]
    positions: list[int]
    seconds: list[float]
    memory: list[int]
    memory_kind: str
    probes: dict[int, dict[str, torch.Tensor]]


@dataclass
class PromptResult:
    prompt: EncodedPrompt
    ref: SideRun
    native: SideRun
    compared: int                              # steps whose contexts match (all in teacher forcing)
    stats: PositionStats
    probe_steps: list[int]
    divergence: dict[str, Any] | None = None   # free running
    loops: dict[str, DegenerationReport] = field(default_factory=dict)


def auto_probe_steps(config: Any, prompt_len: int, n: int) -> list[int]:
    """Step 1, the first step closing an HCA block (a new compressed entry forms), the middle, the last."""
    m = config.hca_ratio
    hca = (-prompt_len) % m or m          # step s feeds position P+s-1; the block closes when (P+s) % m == 0
    return sorted({s for s in (1, hca, n // 2, n - 1) if 1 <= s < n})


def _probe_steps(spec: DecodeSpec, prompt_len: int) -> list[int]:
    if spec.probe_steps == "auto":
        return auto_probe_steps(spec.source.config, prompt_len, spec.tokens)
    return sorted(set(spec.probe_steps))  # type: ignore[arg-type]


def _run_side(model: Any, p: EncodedPrompt, spec: DecodeSpec, steps: list[int], *, forced: list[int] | None,
              choose: Any, progress: Any, label: str, step_fn: Any = None) -> SideRun:
    out: list[Step] = []
    meter = MemoryMeter(model_devices(model))
    from dsv4.streamed import is_streamed

    if forced is not None and is_streamed(model):
        # a streamed native model (dsv4.streamed): layer by layer, each layer read once for the whole decode
        from dsv4.decode.layer_major import run_steps_layer_major

        steps_iter = run_steps_layer_major(model, p.tensor(), spec.tokens, forced, probe_steps=steps, meter=meter)
    else:
        steps_iter = run_steps(model, p.tensor(), spec.tokens, forced=forced, choose=choose, probe_steps=steps,
                               meter=meter, step_fn=step_fn)
    for st in steps_iter:
        out.append(st)
        progress(f"{label} {p.id}", st.step + 1, spec.tokens)
    return SideRun(torch.stack([s.logits for s in out]), [s.target for s in out], [s.fed for s in out],
                   [s.position for s in out], [s.seconds for s in out], [s.memory for s in out], meter.kind,
                   {s.step: s.probes for s in out if s.probes is not None})


def _forced_ids(spec: DecodeSpec) -> list[int] | None:
    return list(spec.forced) if isinstance(spec.forced, list) else None


@dataclass
class DecodeRun:
    results: list[PromptResult]
    timing: dict[str, float]
    native_backend: str
    graph_segments: list[dict[str, Any]] = field(default_factory=list)   # with --graphs: the decoder's report
    # On a kernel backend every native kernel call is judged by the exact audit (parity.audit); a CUDA
    # graph's replays launch no Python call, so with --graphs it sees the eager calls and the captures.
    audit: Any = None


def _graph_decoder(native: Any) -> Any:
    from dsv4.decode.graphs import GraphDecoder
    from dsv4.decode.pieces import GraphDecoderError

    try:
        return GraphDecoder(native)
    except GraphDecoderError as e:
        raise ParityInputError(f"--graphs: {e}") from None


def run_decode(spec: DecodeSpec, loaders: ModelLoaders | None = None, progress: Any = None) -> DecodeRun:
    """Reference on every prompt, then native (one model at a time)."""
    loaders = loaders or DefaultLoaders()
    progress = progress or (lambda *_: None)
    src = spec.source
    steps = {p.id: _probe_steps(spec, p.n_tokens) for p in spec.prompts}
    forced = _forced_ids(spec)
    for p in spec.prompts:   # every request checked before a model is built
        try:
            check_request(src.config, p.n_tokens, spec.tokens, forced, steps[p.id])
        except DecodeInputError as e:
            raise ParityInputError(f"prompt {p.id} ({p.n_tokens} tokens): {e}") from None
    timing: dict[str, float] = {}
    t0 = time.perf_counter()
    ref = loaders.reference(str(src.path), profile=spec.profile, dtype=spec.ref_dtype, device=spec.device,
                            device_map=spec.device_map)
    timing["reference_load"] = time.perf_counter() - t0
    sampler = Sampler(spec.temperature, spec.sample_seed) if spec.forced == "sample" else None
    refs = {}
    for p in spec.prompts:
        choose = sampler if (sampler is not None and spec.mode == "teacher_forced") else greedy
        refs[p.id] = _run_side(ref, p, spec, steps[p.id], forced=forced, choose=choose, progress=progress,
                               label="reference")
    ref = None
    free_memory(spec.device)
    t0 = time.perf_counter()
    native = loaders.native(str(src.path), plan=spec.plan, backend=spec.backend, device=spec.device,
                            device_map=spec.device_map)
    timing["native_load"] = time.perf_counter() - t0
    backend = ",".join(sorted(set(getattr(native, "backend_names", dict)().values()))) or spec.backend
    dec = _graph_decoder(native) if spec.graphs else None
    auditor = None
    if set(getattr(native, "backend_names", dict)().values()) - {"emulated"}:
        from ..audit import CallAuditor

        auditor = CallAuditor()
        auditor.attach(native)
    results = []
    for p in spec.prompts:
        r = refs[p.id]
        if auditor is not None:
            auditor.prompt_id = p.id
        nat_forced = r.targets if spec.mode == "teacher_forced" else None
        n = _run_side(native, p, spec, steps[p.id], forced=nat_forced, choose=greedy, progress=progress,
                      label="native", step_fn=dec.step if dec else None)
        results.append(_analyze(spec, p, r, n, steps[p.id]))
    segments = [s.__dict__ for s in dec.report()] if dec else []
    if auditor is not None:
        auditor.detach()
    native = dec = None
    free_memory(spec.device)
    return DecodeRun(results, timing, backend, segments, auditor)


def _analyze(spec: DecodeSpec, p: EncodedPrompt, r: SideRun, n: SideRun, steps: list[int]) -> PromptResult:
    N = spec.tokens
    div = None
    if spec.mode == "free":
        d = next((s for s in range(N) if r.targets[s] != n.targets[s]), None)
        compared = N if d is None else d + 1    # the logits of step d still saw one context
        div = _divergence(r, n, d, spec)
    else:
        compared = N
    targets = torch.tensor(r.targets[:compared])
    stats = position_stats(r.logits[:compared], n.logits[:compared], targets, topk=spec.settings.topk,
                           near_tie=spec.settings.near_tie)
    loops = {"reference": analyze(r.targets), "native": analyze(n.targets)} if spec.mode == "free" \
        else {"forced": analyze(r.targets)}
    # probe steps past a free-running divergence compare different contexts: dropped
    return PromptResult(p, r, n, compared, stats, [s for s in steps if s < compared], div, loops)


def _rank(logits: torch.Tensor, token: int) -> int:
    """1-based rank of ``token`` in ``logits`` (ties counted in its favour)."""
    return int((logits > logits[token]).sum()) + 1


def _divergence(r: SideRun, n: SideRun, d: int | None, spec: DecodeSpec) -> dict[str, Any]:
    if d is None:
        return {"found": False}
    lr = torch.log_softmax(r.logits[d].double(), -1)
    top2 = lr.topk(2).values
    margin = float(top2[0] - top2[1])
    nat_in_ref, ref_in_nat = _rank(r.logits[d], n.targets[d]), _rank(n.logits[d], r.targets[d])
    k = spec.mutual_topk
    return {"found": True, "step": d, "position": r.positions[d], "ref_token": r.targets[d],
            "native_token": n.targets[d], "ref_top2_margin": margin, "near_tie": margin < spec.settings.near_tie,
            "native_token_ref_rank": nat_in_ref, "ref_token_native_rank": ref_in_nat,
            "mutual_topk": nat_in_ref <= k and ref_in_nat <= k, "k": k}
