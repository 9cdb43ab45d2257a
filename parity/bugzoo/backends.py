"""Kernel-side backends of the bug zoo, so the bug-budget column runs on the CPU too.

:class:`EpilogueBackend` is a copy of the ``emulated`` backend (the contract's executable
definition) whose SwiGLU epilogue is a replaceable function. With the emulated epilogue it is a
*clean* kernel stand-in (the clean row's bug-budget column compares against it and must raise no
alarm); with a wrong epilogue it is a kernel bug the bug-budget column must catch.

The GEMM bodies are copied from ``dsv4.kernels.emulated`` rather than patched into it: a zoo must
never change the backend every other run uses. Backends are registered only while a run needs them
(:func:`installed`), because a registered non-emulated CPU backend would become every other CPU
run's ``auto`` kernel backend.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from dsv4.kernels import emulated, registry
from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest
from dsv4.numerics import swizzled_numel, unswizzle_scales

from .registry import KernelFault, patched

Epilogue = Callable[[torch.Tensor, "float | None"], torch.Tensor]
CLEAN_COPY = "bugzoo-emulated-copy"


class EpilogueBackend(emulated.EmulatedBackend):
    """``emulated`` with replaceable pieces, each the identity of a correct kernel by default:
    ``epilogue(alpha * acc, swiglu_limit)``, ``weight_scales(linear scales) -> scales`` (what the kernel
    reads for a weight operand), ``matmul(a, b) -> acc`` (the FP32 accumulation), ``rows(out) -> out``
    (what is left of the grouped output), ``act_scales(scale bytes) -> bytes`` (what the activation
    quantizer writes) and ``alpha_of(expert, count) -> index`` (whose alpha a grouped GEMM applies)."""

    def __init__(self, name: str, epilogue: Epilogue, *, weight_scales: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                 rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 act_scales: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 alpha_of: Callable[[int, int], int] | None = None) -> None:
        self.name = name
        self.epilogue = epilogue
        self.weight_scales = weight_scales or (lambda s: s)
        self.matmul = matmul or (lambda a, b: a @ b.T)
        self.rows = rows or (lambda y: y)
        self.act_scales = act_scales
        self.alpha_of = alpha_of or (lambda e, count: e)

    def _weight(self, packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        s = self.weight_scales(scales.view(torch.uint8)).contiguous().view(torch.float8_e4m3fn)
        return emulated._block_dequant(packed, s, "linear")

    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        a = emulated._block_dequant(req.a.packed, req.a.scales, req.a.scale_layout)
        bs = req.b.scales if req.b.scale_layout == "linear" else unswizzle_scales(req.b.scales, req.b.rows, req.b.k // 16)
        b = self._weight(req.b.packed, bs)
        alpha = req.a.global_scale * req.b.global_scale
        return self.epilogue(self.matmul(a, b) * alpha, req.swiglu_limit)

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor:
        req.validate(check_values=check_values)
        n, sc = req.n_per_expert, req.b.k // 16
        a = emulated._block_dequant(req.a.packed, req.a.scales, req.a.scale_layout)
        offsets = req.offsets.to("cpu").tolist()
        out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=req.a.device)
        per_expert = swizzled_numel(n, sc)
        for e in range(req.num_experts):
            lo, hi = offsets[e], offsets[e + 1]
            if lo == hi:
                continue
            packed = req.b.packed[e * n:(e + 1) * n]
            if req.b.scale_layout == "swizzled":
                scales = unswizzle_scales(req.b.scales[e * per_expert:(e + 1) * per_expert], n, sc)
            else:
                scales = req.b.scales[e * n:(e + 1) * n]
            b = self._weight(packed, scales)
            alpha = req.alphas[self.alpha_of(e, req.num_experts)]
            out[lo:hi] = self.epilogue(self.matmul(a[lo:hi], b) * alpha, req.swiglu_limit)
        return self.rows(out) if req.swiglu_limit is not None else out

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand:
        op = super().quantize_activation(req, check_values=check_values)
        if self.act_scales is None:
            return op
        s = self.act_scales(op.scales.view(torch.uint8)).contiguous().view(torch.float8_e4m3fn)
        return FP4Operand(op.packed, s, op.global_scale, k=op.k, scale_layout=op.scale_layout)


def unclamped_sigmoid_epilogue(y: torch.Tensor, swiglu_limit: float | None) -> torch.Tensor:
    """The kernel bug: ``min(g, L) * sigmoid(g)`` — the sigmoid reads the UNCLAMPED gate, so every
    element with ``g > L`` gets ``L * sigmoid(g)`` instead of ``silu(L) = L * sigmoid(L)``."""
    if swiglu_limit is None:
        return y.to(torch.bfloat16)
    n = y.shape[-1] // 2
    g = y[..., :n]
    up = torch.clamp(y[..., n:], min=-swiglu_limit, max=swiglu_limit)
    return (torch.clamp(g, max=swiglu_limit) * torch.sigmoid(g) * up).to(torch.bfloat16)


def kernel_fault(name: str, epilogue: Epilogue = emulated._epilogue, *, around: Any = None,
                 **pieces: Any) -> KernelFault:
    """A stand-in kernel backend with one piece replaced (see :class:`EpilogueBackend`); ``around``
    (a :class:`parity.bugzoo.around.Around`): the same fault injected around a real kernel's calls."""
    return KernelFault(name, lambda device: EpilogueBackend(name, epilogue, **pieces), around)


# ---- subtle kernel faults of the kind written outside the project (docs/bugzoo.md) -----------------
def scale_from_neighbour(scales: torch.Tensor, every: int = 256) -> torch.Tensor:
    """One weight scale in ``every`` (flat index ``i % every == every - 1``) read from its neighbour
    ``i - 1``: an off-by-one in a scale-tile address."""
    flat = scales.reshape(-1).clone()
    idx = torch.arange(every - 1, flat.numel(), every, device=flat.device)
    flat[idx] = flat[idx - 1]
    return flat.reshape(scales.shape)


def ktail_dropped(tile: int = 192) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """An FP32 accumulation over k-tiles of ``tile`` that never runs the last, partial tile when K is
    not a multiple of it (a loop bound of ``K // tile`` instead of ``ceil(K / tile)``)."""
    def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        k = a.shape[-1]
        full = (k // tile) * tile if k > tile else k
        return a[..., :full] @ b[..., :full].T
    return matmul


def tile_row_unwritten(y: torch.Tensor, tile_rows: int = 16) -> torch.Tensor:
    """The last row of every ``tile_rows``-row output tile never stored (left zero): a predicate that
    uses ``<`` one row too early."""
    y = y.clone()
    y[tile_rows - 1::tile_rows] = 0
    return y


def alpha_of_next_expert(e: int, count: int) -> int:
    """A grouped GEMM applying expert e+1's alpha (global scale) to expert e: a per-group pointer
    advanced once too often."""
    return (e + 1) % count


def act_scale_bumped(scale_bytes: torch.Tensor, every: int = 64) -> torch.Tensor:
    """One activation block scale in ``every`` written one E4M3 code too large (codes computed with
    the right one): a rounding-mode slip in the scale store."""
    flat = scale_bytes.reshape(-1).clone()
    idx = torch.arange(every - 1, flat.numel(), every, device=flat.device)
    flat[idx] = torch.where(flat[idx] < 0x7E, flat[idx] + 1, flat[idx])
    return flat.reshape(scale_bytes.shape)


CLEAN_KERNEL = kernel_fault(CLEAN_COPY, emulated._epilogue)


@contextlib.contextmanager
def installed(kf: KernelFault) -> Iterator[str]:
    """Register ``kf`` in the backend registry for the duration (CPU and every other device), then
    put the registry back as it was. Yields the backend name."""
    before = registry.available_backends().get(kf.name)
    registry.register_backend(kf.name, kf.factory, supports=lambda d: True, priority=-1,
                              note="bug zoo stand-in (a copy of the emulated backend)")
    try:
        yield kf.name
    finally:
        if before is not None:
            registry.register_backend(before.name, before.factory, supports=before.supports,
                                      priority=before.priority, note=before.note)
        else:
            registry.unregister_backend(kf.name)


def is_real_kernel(backend: Any) -> bool:
    """A backend that runs kernels of its own: not ``emulated`` and not a zoo stand-in copy of it."""
    return backend.name != "emulated" and not isinstance(backend, emulated.EmulatedBackend)


def swap_backend(model: object, kf: KernelFault) -> contextlib.AbstractContextManager[None]:
    """Put the fault ``kf`` into every dispatcher of ``model`` (restored on exit): around the real
    kernel backend a dispatcher runs, when ``kf`` can be injected around one; else its stand-in."""
    stack = contextlib.ExitStack()
    for dev, dispatcher in getattr(model, "dispatchers").items():
        current = dispatcher.backend
        new = kf.around.wrap(current) if kf.around is not None and is_real_kernel(current) \
            else kf.factory(torch.device(dev))
        stack.enter_context(patched(dispatcher, "backend", new))
    return stack


__all__ = ["EpilogueBackend", "CLEAN_COPY", "CLEAN_KERNEL", "unclamped_sigmoid_epilogue", "kernel_fault",
           "scale_from_neighbour", "ktail_dropped", "tile_row_unwritten", "act_scale_bumped", "alpha_of_next_expert",
           "installed", "is_real_kernel", "swap_backend"]
