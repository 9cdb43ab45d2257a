"""The per-call kernel audit of a running model: every FP4 kernel call is replayed through the oracle as
it happens (a tap on the model's dispatchers), judged against its analytic bound, and forgotten; only
counts, the worst ratio and the violating calls (with their operands, for a repro) are kept.

    auditor = CallAuditor()
    with auditor.attached(model):
        model(ids)
    auditor.violations          # [] on clean kernels, whatever the backend

Works for any backend that goes through ``dsv4.layers.dispatch.Dispatcher``, i.e. every registered
backend (``register_backend``), our own and a user's.
"""
from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from dsv4.kernels.contract import capturing as _capturing  # module-level: the tests patch it
from dsv4.layers.dispatch import KernelCall

from ..records import AUDIT_MODE, RunContext
from .calls import CallCheck, audit_request

MAX_KEPT_CALLS = 8        # violating calls whose operands stay in host memory for a repro
_LAYER = re.compile(r"^layers\.(\d+)\.")
# The probe whose record carries a component's audit result (the first probe that component owns).
COMPONENT_PROBE = {"attn_q": "attn.q", "attn_kv": "attn.kv", "compressor": "attn.compressed_kv",
                   "indexer_q": "attn.indexer.q", "indexer_weights": "attn.indexer.scores", "attn_o": "attn.out",
                   "router": "ffn.router.logits", "routed_experts": "ffn.routed.out",
                   "shared_expert": "ffn.shared.out", "kv_cache": "attn.kv"}


def layer_of(module: str) -> int | None:
    m = _LAYER.match(module)
    return int(m.group(1)) if m else None


def probe_for(module: str, component: str) -> str:
    """The probe name an audit record of ``module`` is filed under (``logits`` for the LM head)."""
    layer = layer_of(module)
    if layer is None or component not in COMPONENT_PROBE:
        return "logits"
    return f"layers.{layer}.{COMPONENT_PROBE[component]}"


@dataclass
class Violation:
    """A kernel call that broke its bound: where it ran and how."""

    module: str
    component: str
    op: str
    call_index: int
    backend: str
    prompt_id: str
    check: CallCheck

    @property
    def layer(self) -> int | None:
        return layer_of(self.module)

    def describe(self) -> str:
        where = f"layer {self.layer}" if self.layer is not None else "global"
        first = self.check.examples[0].describe() if self.check.examples else ""
        return (f"{self.module} ({where}, {self.component}) {self.op} call #{self.call_index} on {self.backend}: "
                f"{self.check.violations} of {self.check.elements} elements out of bound, {self.check.worst()}; "
                f"first {first}")

    def summary(self) -> dict[str, Any]:
        return {"module": self.module, "layer": self.layer, "component": self.component, "op": self.op,
                "call_index": self.call_index, "backend": self.backend, "prompt_id": self.prompt_id,
                "violations": self.check.violations, "elements": self.check.elements,
                "worst_ratio": self.check.worst_ratio,
                "examples": [e.summary() for e in self.check.examples]}


@dataclass
class KeptCall:
    """A violating call's operands, on the host: enough to replay it without the model."""

    violation: Violation
    call: KernelCall


@dataclass
class _Tally:
    calls: int = 0
    violations: int = 0
    worst_ratio: float = 0.0


def _to_host(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu").clone()
    if hasattr(obj, "__dataclass_fields__"):
        return type(obj)(**{k: _to_host(getattr(obj, k)) for k in obj.__dataclass_fields__})
    return obj


@dataclass
class CallAuditor:
    """Audits every kernel call of the models it is attached to. ``prompt_id`` labels what follows."""

    keep_calls: int = MAX_KEPT_CALLS
    prompt_id: str = "*"
    tallies: dict[tuple[str, str, str], _Tally] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    kept: list[KeptCall] = field(default_factory=list)
    call_counts: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    # calls made while a CUDA graph was being captured: nothing has run yet (the kernels are recorded,
    # not executed) and a replay would need host reads the capture forbids; the graph's replays then
    # launch no Python call. Counted, never judged.
    captured: int = 0
    # wall seconds spent replaying calls through the oracle (inside the forwards that made them)
    replay_seconds: float = 0.0

    def __call__(self, call: KernelCall) -> None:
        if _capturing():
            self.captured += 1
            return
        index = self.call_counts[(call.module, call.op)]     # the n-th call of this op by this module
        self.call_counts[(call.module, call.op)] += 1
        tally = self.tallies.setdefault((self.prompt_id, call.module, call.component), _Tally())
        tally.calls += 1
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                check = audit_request(call.op, call.request, call.output)
        except Exception as e:  # a request the oracle cannot replay is a finding, not a crash
            self.errors.append(f"{call.module} {call.op} call #{index}: the oracle could not replay it: {e}")
            tally.violations += 1
            tally.worst_ratio = float("inf")
            return
        finally:
            self.replay_seconds += time.perf_counter() - t0
        tally.worst_ratio = max(tally.worst_ratio, check.worst_ratio)
        if check.passed:
            return
        tally.violations += check.violations
        v = Violation(call.module, call.component, call.op, index, call.backend, self.prompt_id, check)
        self.violations.append(v)
        if len(self.kept) < self.keep_calls:
            self.kept.append(KeptCall(v, KernelCall(call.module, call.component, call.op, _to_host(call.request),
                                                    _to_host(call.output), call.backend)))

    def snapshot(self) -> tuple:
        """What :meth:`restore` needs to forget the calls audited after this point (a forward that is
        abandoned and run again, ``parity.probe_home.run_with_home``, must not count its calls twice)."""
        return ({k: _Tally(t.calls, t.violations, t.worst_ratio) for k, t in self.tallies.items()},
                Counter(self.call_counts), len(self.violations), len(self.kept), len(self.errors), self.captured)

    def restore(self, snap: tuple) -> None:
        tallies, counts, n_viol, n_kept, n_err, captured = snap
        self.tallies, self.call_counts = tallies, counts
        del self.violations[n_viol:], self.kept[n_kept:], self.errors[n_err:]
        self.captured = captured

    def attach(self, model: Any) -> None:
        """Tap every dispatcher of ``model`` until :meth:`detach`."""
        self._removers = [d.add_tap(self) for d in getattr(model, "dispatchers", {}).values()]

    def detach(self) -> None:
        for remove in getattr(self, "_removers", []):
            remove()
        self._removers = []

    @contextlib.contextmanager
    def attached(self, model: Any) -> Iterator["CallAuditor"]:
        """Tap every dispatcher of ``model`` for the duration."""
        self.attach(model)
        try:
            yield self
        finally:
            self.detach()

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.tallies.values())

    @property
    def passed(self) -> bool:
        return not self.violations and not self.errors

    def records(self, ctx: RunContext, prompt_modes: dict[str, str], pair: str = "bug_budget") -> list[dict[str, Any]]:
        """Per prompt and (layer, component): ``audit_calls``, ``audit_violations`` (judged: must be 0) and
        ``audit_worst_ratio`` (information), filed under the component's probe, compare mode ``audit``."""
        merged: dict[tuple[str, str], _Tally] = {}
        for (pid, module, component), t in self.tallies.items():
            m = merged.setdefault((pid, probe_for(module, component)), _Tally())
            m.calls += t.calls
            m.violations += t.violations
            m.worst_ratio = max(m.worst_ratio, t.worst_ratio)
        out = []
        for (pid, probe), t in merged.items():
            for metric, value in (("audit_calls", t.calls), ("audit_violations", t.violations),
                                  ("audit_worst_ratio", t.worst_ratio)):
                out.append(ctx.record(prompt_id=pid, prompt_mode=prompt_modes.get(pid, "chat"), pair=pair,
                                      compare_mode=AUDIT_MODE, probe=probe, metric=metric, value=value))
        return out

    def summary(self) -> dict[str, Any]:
        return {"calls": self.calls, "violations": sum(v.check.violations for v in self.violations),
                "violating_calls": len(self.violations),
                "worst_ratio": max((t.worst_ratio for t in self.tallies.values()), default=0.0),
                "first": self.violations[0].summary() if self.violations else None,
                "errors": list(self.errors), "captured": self.captured}
