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
from typing import Callable, Iterator

import torch

from dsv4.kernels import emulated, registry
from dsv4.kernels.contract import GemmRequest, GroupedGemmRequest
from dsv4.numerics import swizzled_numel, unswizzle_scales

from .registry import KernelFault, patched

Epilogue = Callable[[torch.Tensor, "float | None"], torch.Tensor]
CLEAN_COPY = "bugzoo-emulated-copy"


class EpilogueBackend(emulated.EmulatedBackend):
    """``emulated`` with its GEMM epilogue replaced by ``epilogue(alpha * acc, swiglu_limit)``."""

    def __init__(self, name: str, epilogue: Epilogue) -> None:
        self.name = name
        self.epilogue = epilogue

    def gemm(self, req: GemmRequest) -> torch.Tensor:
        req.validate()
        a = emulated._block_dequant(req.a.packed, req.a.scales, req.a.scale_layout)
        b = emulated._block_dequant(req.b.packed, req.b.scales, req.b.scale_layout)
        alpha = req.a.global_scale * req.b.global_scale
        return self.epilogue((a @ b.T) * alpha, req.swiglu_limit)

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
            b = emulated._block_dequant(packed, scales, "linear")
            out[lo:hi] = self.epilogue((a[lo:hi] @ b.T) * req.alphas[e], req.swiglu_limit)
        return out


def unclamped_sigmoid_epilogue(y: torch.Tensor, swiglu_limit: float | None) -> torch.Tensor:
    """The kernel bug: ``min(g, L) * sigmoid(g)`` — the sigmoid reads the UNCLAMPED gate, so every
    element with ``g > L`` gets ``L * sigmoid(g)`` instead of ``silu(L) = L * sigmoid(L)``."""
    if swiglu_limit is None:
        return y.to(torch.bfloat16)
    n = y.shape[-1] // 2
    g = y[..., :n]
    up = torch.clamp(y[..., n:], min=-swiglu_limit, max=swiglu_limit)
    return (torch.clamp(g, max=swiglu_limit) * torch.sigmoid(g) * up).to(torch.bfloat16)


def kernel_fault(name: str, epilogue: Epilogue) -> KernelFault:
    return KernelFault(name, lambda device: EpilogueBackend(name, epilogue))


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


def swap_backend(model: object, kf: KernelFault) -> contextlib.AbstractContextManager[None]:
    """Move every dispatcher of ``model`` onto the backend ``kf`` (restored on exit)."""
    stack = contextlib.ExitStack()
    for dev, dispatcher in getattr(model, "dispatchers").items():
        stack.enter_context(patched(dispatcher, "backend", kf.factory(torch.device(dev))))
    return stack


__all__ = ["EpilogueBackend", "CLEAN_COPY", "CLEAN_KERNEL", "unclamped_sigmoid_epilogue", "kernel_fault",
           "installed", "swap_backend"]
