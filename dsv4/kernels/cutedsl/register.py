"""Registers ``cutedsl_sm90`` and ``cutedsl_sm100`` (the ``cutedsl`` entry point of ``dsv4_parity.backends``).

Without the ``cutedsl`` extra (``import cutlass`` fails) both names are still registered, as
backends that support no device, so asking for them explains why instead of "unknown backend".
"""
from __future__ import annotations

import logging

import torch

from ..registry import register_backend

log = logging.getLogger(__name__)


def _capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device if device.index is not None else None)


def _is_major(major: int):
    def supports(device: torch.device) -> bool:
        cap = _capability(torch.device(device))
        return cap is not None and cap[0] == major
    return supports


def _any_gpu_with_major(major: int) -> bool:
    if not torch.cuda.is_available():
        return False
    return any(torch.cuda.get_device_capability(i)[0] == major for i in range(torch.cuda.device_count()))


def _sm90_factory(device: torch.device):
    from .sm90 import Sm90Backend

    return Sm90Backend(device)


def _sm100_factory(device: torch.device):
    from .sm100 import Sm100Backend  # provided by the sm_100a kernel package

    return Sm100Backend(device)


def register() -> None:
    """Entry point (group ``dsv4_parity.backends``): the registry calls it, never imports this module."""
    try:
        import cutlass  # noqa: F401  (the optional extra)
    except Exception as e:  # ImportError, or a broken CUDA binding underneath
        note = f"nvidia-cutlass-dsl unavailable ({type(e).__name__}: {e}); install the 'cutedsl' extra"
        log.debug("cutedsl backends disabled: %s", note)
        for name, fac in (("cutedsl_sm90", _sm90_factory), ("cutedsl_sm100", _sm100_factory)):
            register_backend(name, fac, supports=lambda d: False, priority=10, note=note)
        return
    register_backend("cutedsl_sm90", _sm90_factory, supports=_is_major(9), priority=10,
                     note="" if _any_gpu_with_major(9) else "compiled, not executed here")
    register_backend("cutedsl_sm100", _sm100_factory, supports=_is_major(10), priority=10,
                     note="" if _any_gpu_with_major(10) else "compiled, not executed here")
