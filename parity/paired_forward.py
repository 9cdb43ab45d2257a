"""A prompt's propagated and isolated forwards in one pass over the layers, for a streamed native model
(``dsv4.streamed``): each layer, once built, runs the prompt's own streams (propagated) and the anchor's
input to it (isolated) before the next is built, so a prompt reads the checkpoint once, not twice.

The calls are those of :func:`parity.runner.run_propagated` (a prefill is ``embed``, every ``layer``,
``head``: ``NativeModel._forward``) and :func:`parity.runner.run_isolated`, each mode under its own
probe recorder and state, so the probes are the same; each mode's seconds are the sum of its own calls
(synchronized after each).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from dsv4.probes import ProbeRecorder, layer_probe, suspended

from .errors import SurfaceError
from .runner import SideOutput, _on_cpu, _sync, _trace_nonfinite


def run_paired(model: Any, ids: torch.Tensor, anchor: SideOutput, num_layers: int, device: str = "cpu",
               probes_on_device: bool = False) -> tuple[SideOutput, tuple[dict[str, torch.Tensor], float]]:
    """(``run_propagated``'s output, ``run_isolated``'s (probes, seconds)) from one pass over the layers."""
    missing = [layer_probe(i, "out") for i in range(num_layers) if layer_probe(i, "out") not in anchor.probes]
    if missing:
        raise SurfaceError(f"isolated mode needs the anchor's layer outputs, missing {missing}")
    ids_dev = ids.to(device) if not _on_cpu(device) else ids
    to_cpu = not _on_cpu(device) and not probes_on_device
    recs = {"propagated": ProbeRecorder(to_cpu=to_cpu), "isolated": ProbeRecorder(to_cpu=to_cpu)}
    seconds = {"propagated": 0.0, "isolated": 0.0}

    def call(mode: str, fn: Any, *args: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), recs[mode], _trace_nonfinite(recs[mode], mode):
            out = fn(*args)
        _sync(device)
        seconds[mode] += time.perf_counter() - t0
        return out

    prop_state = call("propagated", model.new_state, ids_dev)
    X = call("propagated", model.embed, ids_dev)
    iso_state = call("isolated", model.new_state, ids_dev)
    call("isolated", model.embed, ids_dev)
    for i in range(num_layers):
        X = call("propagated", model.layer, i, X, prop_state)
        call("isolated", model.layer, i, anchor.layer_input(i), iso_state)
    logits = call("propagated", model.head, X)
    call("isolated", model.head, anchor.probes[layer_probe(num_layers - 1, "out")])
    probes = dict(recs["propagated"].values)
    if "logits" not in probes or tuple(logits.shape) != tuple(probes["logits"].shape):
        raise SurfaceError(f"{type(model).__name__}: its head returned logits {tuple(logits.shape)}, its 'logits' "
                           f"probe {tuple(probes['logits'].shape) if 'logits' in probes else 'absent'}")
    with torch.no_grad(), suspended():
        streams = model.embed(ids_dev).detach().to("cpu")
    return (SideOutput(probes, streams, {"forward": seconds["propagated"]}),
            (dict(recs["isolated"].values), seconds["isolated"]))


__all__ = ["run_paired"]
