"""The fault registry: ``@register_fault(...)`` turns a generator over a native model into a
:class:`Fault`, and calling the fault on a model returns a context manager that patches that
instance and restores it exactly on exit.

A fault is written like a ``contextlib.contextmanager``::

    @register_fault("my_fault", layer=2, component="router", column="logic",
                    description="what the bug is")
    def my_fault(model):
        router = model.blocks[2].moe.router
        with patched(router, "weigh", lambda scores, ids: ...):
            yield

    with my_fault(model):          # the model computes with the bug here
        ...

Only instances are patched (never a class, never the reference): :func:`patched` shadows one
attribute of one object and on exit deletes the shadow (or restores the previous instance value),
so the object's ``__dict__`` is what it was. A patched layer method also switches off the fused
kernel path that would bypass it (``dsv4.layers.swiglu.overridden``).

The expectation is part of the registration: ``column`` is the column that must raise the alarm
(``logic``: a code bug, visible with every weight in BF16; ``floor``: a precision mistake, the
floor column exceeds its thresholds; ``bug_budget``: a kernel bug, emulated <-> kernel), and
``layer`` / ``localization`` are what the first divergence (isolated mode, that column) must name:
the injected layer (None for a fault acting on the whole model, e.g. the LM head) and one of the
component classes of ``localization`` (default: ``component`` itself).

A bug-budget fault lives in a kernel backend: ``backend=KernelFault(name, factory)`` names a backend
the zoo registers (``dsv4.kernels.registry.register_backend``) for the duration of the run and uses
as the kernel side of the bug-budget column; calling such a fault on a model moves the model's
dispatchers onto that backend.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

import torch

from dsv4.kernels.contract import Backend
from dsv4.probes import LOCALIZATION_CLASSES, PLAN_CLASSES

from ..errors import ParityInputError
from ..records import COMPARE_MODES, PAIRS

COMPONENTS = PLAN_CLASSES + LOCALIZATION_CLASSES
BUILTIN_MODULE = "parity.bugzoo.faults"


class FaultError(ParityInputError):
    """A fault that cannot be registered, found or loaded (bad input: exit 2 at the CLI)."""


class FaultTargetError(TypeError):
    """A fault applied to something it must not patch (the reference model, a missing layer, a
    component already in the format the fault would force)."""


@dataclass(frozen=True)
class KernelFault:
    """A faulty kernel backend: ``factory(device) -> Backend`` registered under ``name`` (a stand-in for
    devices without a kernel backend). ``around``, when given, injects the same fault around a real
    kernel backend's calls (:mod:`parity.bugzoo.around`): where one executes, the fault runs on it."""

    name: str
    factory: Callable[[torch.device], Backend]
    around: Any = None


@dataclass(frozen=True)
class Fault:
    name: str
    layer: int | None
    component: str
    column: str
    description: str
    localization: tuple[str, ...]
    inject: Callable[[Any], ContextManager[None]] = field(repr=False)
    backend: KernelFault | None = None
    modes: tuple[str, ...] = ("isolated",)
    module: str = ""
    # a weight or loader bug lives in the checkpoint: ``checkpoint(path) -> path`` writes a faulty copy
    # that the native side of the fault's column loads (its loader and weight audit see the bug too)
    checkpoint: Callable[[str], str] | None = None

    def __call__(self, model: Any) -> ContextManager[None]:
        """A context manager patching ``model`` (a native model instance) for its duration."""
        check_native(model, self.name)
        return self.inject(model)

    def localizes(self, layer: int | None, component: str | None) -> bool:
        """Does a first divergence at (layer, component) name this fault's injection point?"""
        return layer == self.layer and component in self.localization

    def expectation(self) -> dict[str, Any]:
        return {"column": self.column, "layer": self.layer, "component": self.component,
                "localization": list(self.localization), "modes": list(self.modes),
                "backend": self.backend.name if self.backend else None, "checkpoint": self.checkpoint is not None}


_FAULTS: dict[str, Fault] = {}
_BUILTIN_LOADED = False


def check_native(model: Any, fault: str = "fault") -> None:
    """Faults patch the native model only: the reference is the oracle (docs/design.md principle 2)."""
    side = getattr(model, "side", None)
    if side != "native" or not hasattr(model, "blocks"):
        raise FaultTargetError(f"{fault}: expected a native model (dsv4.load_model), found "
                               f"{type(model).__name__} with side {side!r}; faults never patch the reference")


def block_of(model: Any, layer: int) -> Any:
    """``model.blocks[layer]``, or a FaultTargetError naming the layers the model has."""
    if not 0 <= layer < len(model.blocks):
        raise FaultTargetError(f"layer {layer}: the model has layers 0..{len(model.blocks) - 1}")
    return model.blocks[layer]


def register_fault(name: str, *, layer: int | None, component: str, column: str, description: str,
                   localization: tuple[str, ...] | None = None, backend: KernelFault | None = None,
                   modes: tuple[str, ...] = ("isolated",), replace: bool = False,
                   checkpoint: Callable[[str], str] | None = None
                   ) -> Callable[[Callable[[Any], Iterator[None]]], Fault]:
    """Decorator over a generator ``fn(model)`` that patches, yields once, and restores (in a
    ``with``/``finally``). Returns the :class:`Fault`. A second registration under the same name is
    an error unless ``replace=True`` or it is the same function re-imported. ``checkpoint``: a weight or
    loader bug, ``checkpoint(path) -> faulty_path``; the fault's native side is loaded from the copy."""
    if not isinstance(name, str) or not name.strip():
        raise FaultError(f"fault name: expected a non-empty string, found {name!r}")
    if column not in PAIRS:
        raise FaultError(f"fault {name!r}: column: expected one of {list(PAIRS)}, found {column!r}")
    loc = tuple(localization) if localization else (component,)
    for c in (component, *loc):
        if c not in COMPONENTS:
            raise FaultError(f"fault {name!r}: component class: expected one of {list(COMPONENTS)}, found {c!r}")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 0):
        raise FaultError(f"fault {name!r}: layer: expected a layer index >= 0 or None, found {layer!r}")
    bad_modes = [m for m in modes if m not in COMPARE_MODES]
    if bad_modes or not modes:
        raise FaultError(f"fault {name!r}: modes: expected a non-empty subset of {list(COMPARE_MODES)}, "
                         f"found {list(modes)}")
    if "isolated" not in modes:
        raise FaultError(f"fault {name!r}: modes must include 'isolated' (localization reads the isolated "
                         f"first divergence), found {list(modes)}")
    if checkpoint is not None and not callable(checkpoint):
        raise FaultError(f"fault {name!r}: checkpoint: expected a callable path -> path, found {checkpoint!r}")
    if backend is not None and column != "bug_budget":
        raise FaultError(f"fault {name!r}: a faulty kernel backend shows in the bug_budget column, found "
                         f"column {column!r}")

    def deco(fn: Callable[[Any], Iterator[None]]) -> Fault:
        old = _FAULTS.get(name)
        # re-importing the module that registered it (e.g. --faults-module twice) is not a clash
        same_fn = old is not None and _origin(old.inject) == _origin(fn)
        if old is not None and not (replace or same_fn):
            raise FaultError(f"fault {name!r}: already registered by {old.module}; pass replace=True to "
                             f"override it")
        f = Fault(name, layer, component, column, description.strip(), loc, contextlib.contextmanager(fn),
                  backend, tuple(modes), fn.__module__, checkpoint)
        _FAULTS[name] = f
        return f

    return deco


def _origin(fn: Callable[..., Any]) -> tuple[str, str]:
    fn = getattr(fn, "__wrapped__", fn)     # contextlib.contextmanager keeps the generator function here
    return fn.__module__, fn.__qualname__


def _load_builtin() -> None:
    global _BUILTIN_LOADED
    if not _BUILTIN_LOADED:
        _BUILTIN_LOADED = True
        importlib.import_module(BUILTIN_MODULE)


def list_faults() -> list[Fault]:
    """Every registered fault (built-ins first, then user faults in registration order)."""
    _load_builtin()
    return list(_FAULTS.values())


def get_fault(name: str) -> Fault:
    _load_builtin()
    if name not in _FAULTS:
        raise FaultError(f"unknown fault: expected one of {sorted(_FAULTS)}, found {name!r} "
                         f"(user faults: --faults-module)")
    return _FAULTS[name]


def load_faults_module(spec: str) -> list[Fault]:
    """Import a user module (dotted name, or a ``.py`` path) whose import calls ``register_fault``;
    returns the faults it registered."""
    _load_builtin()
    before = set(_FAULTS)
    try:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise FaultError(f"--faults-module: expected a module name or an existing .py file, found {spec!r}")
            modname = f"parity_bugzoo_user_{path.stem}"
            mspec = importlib.util.spec_from_file_location(modname, path)
            assert mspec is not None and mspec.loader is not None
            module = importlib.util.module_from_spec(mspec)
            sys.modules[modname] = module
            mspec.loader.exec_module(module)
        else:
            importlib.import_module(spec)
    except ImportError as e:
        raise FaultError(f"--faults-module {spec!r}: cannot import it ({e})") from None
    except SyntaxError as e:
        raise FaultError(f"--faults-module {spec!r}: syntax error ({e})") from None
    return [f for n, f in _FAULTS.items() if n not in before]


def unregister_fault(name: str) -> None:
    """Remove a fault (tests registering throw-away faults clean up with this)."""
    if _FAULTS.pop(name, None) is None:
        raise FaultError(f"unregister_fault: no fault named {name!r}")


_MISSING = object()


@contextlib.contextmanager
def patched(obj: Any, attr: str, value: Any) -> Iterator[None]:
    """Shadow ``obj.attr`` on this instance only; on exit the instance ``__dict__`` is restored (the
    shadow deleted, or the previous instance value put back) — the class is never touched."""
    if not hasattr(obj, "__dict__"):
        raise FaultTargetError(f"cannot patch {attr!r} on {type(obj).__name__}: it has no instance dict")
    if not hasattr(obj, attr):
        raise FaultTargetError(f"cannot patch {type(obj).__name__}.{attr}: no such attribute")
    old = vars(obj).get(attr, _MISSING)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        if old is _MISSING:
            delattr(obj, attr)
        else:
            setattr(obj, attr, old)
