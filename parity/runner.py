"""Drive one model through the surface of docs/model_surface.md and capture its probes.

* :func:`run_propagated`: ``model(ids)`` under a :class:`~dsv4.probes.ProbeRecorder` (every probe),
  plus ``model.embed(ids)`` (the streams entering layer 0, needed when this side anchors an
  isolated comparison).
* :func:`run_isolated`: the test model layer by layer, each ``layer(i, X, state)`` fed the
  **anchor's** input to that layer (the anchor's ``layers.{i-1}.out`` probe, or its ``embed(ids)``
  streams for i = 0) and ``head`` fed the anchor's last ``out`` — so each probe's error is local.

Models are built through :class:`ModelLoaders` (the real ``reference.load_model`` /
``dsv4.load_model`` by default; tests and the bug zoo pass their own).
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol

import torch

from dsv4.probes import ProbeRecorder, component_of, layer_probe, parse_probe, suspended

from .errors import NonFiniteError, SurfaceError

STREAMS_KEY = "__embed_streams__"   # the anchor's embed(ids) output, stored beside its probes


class ModelLoaders(Protocol):
    def reference(self, path: str, *, profile: str, dtype: torch.dtype, device: str,
                  device_map: Mapping[Any, str] | None) -> Any: ...

    def native(self, path: str, *, plan: Any, backend: str, device: str,
               device_map: Mapping[Any, str] | None) -> Any: ...


class DefaultLoaders:
    """The project's two models (imported lazily so the harness imports without them)."""

    def reference(self, path: str, *, profile: str, dtype: torch.dtype, device: str,
                  device_map: Mapping[Any, str] | None) -> Any:
        import reference

        return reference.load_model(path, profile=profile, dtype=dtype, device=device, device_map=device_map)

    def native(self, path: str, *, plan: Any, backend: str, device: str,
               device_map: Mapping[Any, str] | None) -> Any:
        """Built whole, or streamed (``dsv4.streamed``) when it is larger than its one GPU
        (``fit_check.streams_native``)."""
        import dsv4
        from dsv4.checkpoint.reader import open_checkpoint
        from dsv4.model import resolve_checkpoint
        from dsv4.plan import resolve_plan

        from .fit_check import streams_native

        config = open_checkpoint(resolve_checkpoint(path)).config
        if streams_native(config, resolve_plan(plan), device, device_map):
            from dsv4.streamed import load_streamed_model

            return load_streamed_model(path, plan=plan, backend=backend, device=device)
        return dsv4.load_model(path, plan=plan, backend=backend, device=device, device_map=device_map)

    def rebackend(self, model: Any, backend: str) -> Any | None:
        """``model`` (built by :meth:`native`) running on ``backend`` from now on, or None when a subclass
        builds its own native models (a fault injection wraps ``native``: its kernel model must be built
        by it, never borrowed)."""
        if type(self).native is not DefaultLoaders.native or not hasattr(model, "switch_backend"):
            return None
        model.switch_backend(backend)
        return model


@dataclass
class SideOutput:
    """One model's prefill of one prompt: probes (CPU), streams into layer 0, timings (seconds)."""

    probes: dict[str, torch.Tensor]
    streams: torch.Tensor
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def logits(self) -> torch.Tensor:
        return self.probes["logits"]

    def layer_input(self, i: int) -> torch.Tensor:
        """The streams entering layer ``i`` (what isolated mode feeds the test layer)."""
        return self.streams if i == 0 else self.probes[layer_probe(i - 1, "out")]


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _on_cpu(device: str) -> bool:
    return torch.device(device).type == "cpu"


@contextmanager
def _trace_nonfinite(rec: ProbeRecorder, mode: str) -> Iterator[None]:
    """On a failing forward, name the first probe recorded so far that holds NaN/Inf (scanned only
    then: nothing is added to a forward that succeeds)."""
    try:
        yield
    except Exception as e:
        try:
            rec.wait()      # the host copies are asynchronous: complete them before reading
        except Exception:
            pass            # the device itself failed: the forward's error stands
        for name in rec.order:
            v = rec.values[name]
            if isinstance(v, torch.Tensor) and v.is_floating_point() and _abnormal(name, v):
                layer, _ = parse_probe(name)
                raise NonFiniteError(name, layer, component_of(name), mode, e) from e
        raise


def _abnormal(name: str, v: torch.Tensor) -> bool:
    """NaN or +Inf anywhere; -Inf too, except in score probes where it is the causal mask."""
    if bool(torch.isnan(v).any()) or bool(torch.isposinf(v).any()):
        return True
    return not name.endswith("scores") and bool(torch.isneginf(v).any())


def run_propagated(model: Any, ids: torch.Tensor, device: str = "cpu", probes_on_device: bool = False) -> SideOutput:
    """Prefill ``ids`` with every probe recorded; ``seconds['forward']`` is the model call alone. The
    probes come back on the host unless ``probes_on_device`` (``parity.probe_home``)."""
    ids_dev = ids.to(device) if not _on_cpu(device) else ids
    rec = ProbeRecorder(to_cpu=not _on_cpu(device) and not probes_on_device)
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad(), rec, _trace_nonfinite(rec, "propagated"):
        logits = model(ids_dev)
    _sync(device)
    t1 = time.perf_counter()
    probes = dict(rec.values)
    if "logits" not in probes:
        raise SurfaceError(f"{type(model).__name__}: emitted no 'logits' probe (docs/model_surface.md)")
    if tuple(logits.shape) != tuple(probes["logits"].shape):
        raise SurfaceError(f"{type(model).__name__}: returned logits {tuple(logits.shape)} but the 'logits' "
                           f"probe has shape {tuple(probes['logits'].shape)}")
    with torch.no_grad(), suspended():
        streams = model.embed(ids_dev).detach().to("cpu")
    return SideOutput(probes, streams, {"forward": t1 - t0})


def run_isolated(model: Any, ids: torch.Tensor, anchor: SideOutput, num_layers: int,
                 device: str = "cpu", probes_on_device: bool = False) -> tuple[dict[str, torch.Tensor], float]:
    """The test model's probes with every layer fed the anchor's layer input; returns (probes, seconds)."""
    ids_dev = ids.to(device) if not _on_cpu(device) else ids
    rec = ProbeRecorder(to_cpu=not _on_cpu(device) and not probes_on_device)
    missing = [layer_probe(i, "out") for i in range(num_layers) if layer_probe(i, "out") not in anchor.probes]
    if missing:
        raise SurfaceError(f"isolated mode needs the anchor's layer outputs, missing {missing}")
    _sync(device)
    t0 = time.perf_counter()
    with torch.no_grad(), rec, _trace_nonfinite(rec, "isolated"):
        state = model.new_state(ids_dev)
        model.embed(ids_dev)
        for i in range(num_layers):
            model.layer(i, anchor.layer_input(i), state)
        model.head(anchor.probes[layer_probe(num_layers - 1, "out")])
    _sync(device)
    return dict(rec.values), time.perf_counter() - t0


def free_memory(device: str) -> None:
    """Give a dropped model's device memory back before the next one is built. Only on CUDA: on the
    CPU reference counting frees the model at once, and a full ``gc.collect`` cost 0.2 s a call
    (a third of a tiny run's harness overhead)."""
    if torch.device(device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
