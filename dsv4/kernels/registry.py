"""Backend registry: ``register_backend(name, factory)``; ``get_backend('auto', device)`` picks by device.

External kernel packages plug in through the entry-point group ``dsv4_parity.backends`` (each entry
point names a zero-argument callable that registers its backends), or by calling
``register_backend`` themselves before the harness resolves ``--backend``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from .contract import Backend

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "dsv4_parity.backends"


class BackendError(RuntimeError):
    """A backend was asked for that does not exist or cannot run on the requested device."""


@dataclass(frozen=True)
class BackendInfo:
    name: str
    factory: Callable[[torch.device], Backend]
    # Which devices it can execute on: predicate over a torch.device.
    supports: Callable[[torch.device], bool]
    # Auto-selection order: higher wins among backends supporting the device; < 0: never auto's choice.
    priority: int = 0
    # Shown in records: e.g. "compiled, not executed here" for a backend with no matching GPU.
    note: str = ""


_REGISTRY: dict[str, BackendInfo] = {}
_ENTRY_POINTS_LOADED = False


def register_backend(name: str, factory: Callable[[torch.device], Backend], *,
                     supports: Callable[[torch.device], bool] = lambda d: True, priority: int = 0,
                     note: str = "") -> None:
    if not name or not isinstance(name, str):
        raise BackendError(f"backend name: expected a non-empty string, found {name!r}")
    _REGISTRY[name] = BackendInfo(name, factory, supports, priority, note)


def unregister_backend(name: str) -> None:
    """Remove a backend (e.g. a temporary one a test or the bug zoo registered); unknown names are
    ignored. A registered non-emulated backend would otherwise become ``auto``'s choice."""
    _REGISTRY.pop(name, None)


# The built-in backends' entry points, as pyproject.toml declares them, also called when the package's
# metadata is absent (a source tree on PYTHONPATH). Data, not imports: this module imports no
# backend, every backend imports it; installed plugins of the group are called the same way.
BUILTIN_ENTRY_POINTS = {"emulated": "dsv4.kernels.emulated:register",
                        "cutedsl": "dsv4.kernels.cutedsl.register:register"}


def _call(name: str, target: str) -> None:
    import importlib

    module, _, func = target.partition(":")
    try:
        getattr(importlib.import_module(module), func)()
    except Exception as e:  # a broken plugin must not break the others
        log.warning("backend plugin %s (%s) failed to load: %s", name, target, e)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for name, target in {**BUILTIN_ENTRY_POINTS, **found}.items():
        _call(name, target)


def available_backends() -> dict[str, BackendInfo]:
    _load_entry_points()
    return dict(_REGISTRY)


def get_backend(name: str = "auto", device: str | torch.device = "cpu") -> Backend:
    """Resolve a backend for ``device``. ``auto`` takes the highest-priority backend supporting it
    (priority >= 0: a negative priority means "by name only")."""
    return resolve_backend(name, device).factory(torch.device(device))


def resolve_backend(name: str = "auto", device: str | torch.device = "cpu", *,
                    exclude: tuple[str, ...] = ()) -> BackendInfo:
    """The backend ``get_backend`` would build, without building it. ``exclude`` names backends
    ``auto`` must not pick (the harness excludes ``emulated`` when it needs a kernel backend)."""
    dev = torch.device(device)
    infos = available_backends()
    if name == "auto":
        cands = sorted((i for i in infos.values()
                        if i.name not in exclude and i.priority >= 0 and i.supports(dev)), key=lambda i: -i.priority)
        if not cands:
            raise BackendError(f"no backend supports device {dev}; registered: {sorted(infos)}")
        return cands[0]
    if name not in infos:
        raise BackendError(f"unknown backend: expected one of {sorted(infos) + ['auto']}, found {name!r}")
    info = infos[name]
    if not info.supports(dev):
        raise BackendError(f"backend {name!r} cannot execute on device {dev}"
                           f"{' (' + info.note + ')' if info.note else ''}")
    return info


def register_shared_backend(name: str) -> str:
    """Register ``name + "_shared"``: backend ``name`` with one instance per device for every model of
    this process (the CuTe DSL kernels compile once per backend instance, so each model load would
    otherwise compile them again). Priority -1: never ``auto``'s choice. Idempotent; returns the name."""
    shared = name + "_shared"
    if shared in available_backends():
        return shared
    base, made = backend_info(name), {}

    def factory(dev: torch.device) -> Backend:
        if str(dev) not in made:
            made[str(dev)] = base.factory(dev)
        return made[str(dev)]

    register_backend(shared, factory, supports=base.supports, priority=-1, note=base.note)
    return shared


def backend_info(name: str) -> BackendInfo:
    infos = available_backends()
    if name not in infos:
        raise BackendError(f"unknown backend: expected one of {sorted(infos)}, found {name!r}")
    return infos[name]
