"""Every FP4 kernel call goes through a ``Dispatcher``: it forwards the contract request to the
backend and counts what ran, per (component class, backend, op) and per module.

The log belongs to one model instance (no global state). ``KernelLog.missing`` answers "which
FP4-planned module never reached the requested backend", so a plan flip whose kernels never execute
cannot pass for harmless.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..kernels.contract import ActQuantRequest, Backend, FP4Operand, GemmRequest, GroupedGemmRequest

GEMM_OPS = ("gemm", "grouped_gemm")


class KernelsNotRunError(AssertionError):
    """An FP4-planned component never executed on the requested backend."""


@dataclass
class KernelLog:
    """``counts[(component, backend, op)]`` and ``by_module[(module, backend, op)]``; ``expected`` holds
    the FP4 modules registered at load (module name -> (component class, backend name))."""

    counts: Counter = field(default_factory=Counter)
    by_module: Counter = field(default_factory=Counter)
    expected: dict[str, tuple[str, str]] = field(default_factory=dict)

    def record(self, module: str, component: str, backend: str, op: str) -> None:
        self.counts[(component, backend, op)] += 1
        self.by_module[(module, backend, op)] += 1

    def expect(self, module: str, component: str, backend: str) -> None:
        self.expected[module] = (component, backend)

    def missing(self) -> list[str]:
        """Expected modules with no GEMM (or no activation quantization) on their requested backend."""
        out = []
        for module, (comp, backend) in self.expected.items():
            ran_gemm = any(self.by_module[(module, backend, op)] for op in GEMM_OPS)
            ran_quant = self.by_module[(module, backend, "quantize_activation")] > 0
            if not (ran_gemm and ran_quant):
                what = [n for n, ok in (("gemm", ran_gemm), ("quantize_activation", ran_quant)) if not ok]
                out.append(f"{module} [{comp}]: no {'/'.join(what)} on {backend!r}")
        return out

    def reset(self) -> None:
        self.counts.clear()
        self.by_module.clear()


@dataclass(frozen=True)
class KernelCall:
    """One finished kernel call as a tap sees it: the module and plan class that issued it, the op
    (``gemm``, ``grouped_gemm``, ``quantize_activation``), the validated request, the backend's output
    and the backend's name."""

    module: str
    component: str
    op: str
    request: Any
    output: Any
    backend: str


Tap = Callable[[KernelCall], None]


class Dispatcher:
    """One backend on one device, plus the model's log. ``taps`` observe every finished call (an
    observer such as a per-call audit); with none registered a call costs one empty-list check."""

    def __init__(self, backend: Backend, log: KernelLog) -> None:
        self.backend = backend
        self.log = log
        self.taps: list[Tap] = []

    def add_tap(self, tap: Tap) -> Callable[[], None]:
        """Observe every call from now on; returns the function that removes the tap again."""
        self.taps.append(tap)
        return lambda: self.taps.remove(tap) if tap in self.taps else None

    def _tapped(self, module: str, component: str, op: str, req: Any, out: Any) -> None:
        for tap in list(self.taps):
            tap(KernelCall(module, component, op, req, out, self.backend.name))

    @property
    def name(self) -> str:
        return self.backend.name

    def expect(self, module: str, component: str) -> None:
        """Register an FP4 module that must reach this backend (see ``KernelLog.missing``)."""
        self.log.expect(module, component, self.backend.name)

    def gemm(self, module: str, component: str, req: GemmRequest) -> torch.Tensor:
        y = self.backend.gemm(req)
        self.log.record(module, component, self.backend.name, "gemm")
        if self.taps:
            self._tapped(module, component, "gemm", req, y)
        return y

    def grouped_gemm(self, module: str, component: str, req: GroupedGemmRequest) -> torch.Tensor:
        y = self.backend.grouped_gemm(req)
        self.log.record(module, component, self.backend.name, "grouped_gemm")
        if self.taps:
            self._tapped(module, component, "grouped_gemm", req, y)
        return y

    def quantize_activation(self, module: str, component: str, req: ActQuantRequest) -> FP4Operand:
        a = self.backend.quantize_activation(req)
        self.log.record(module, component, self.backend.name, "quantize_activation")
        if self.taps:
            self._tapped(module, component, "quantize_activation", req, a)
        return a
