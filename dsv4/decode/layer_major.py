"""A teacher-forced decode run layer by layer: every step's token through layer 0, then every step's
through layer 1, and so on, so a streamed model (``dsv4.streamed``) reads each layer once for the whole
decode instead of once a step.

With the continuation forced, step ``s`` feeds a known token, so a layer's work for step ``s`` needs only
that layer's output for the same token one layer down and that layer's own cache after steps ``< s``;
the order of layers against steps is free. Each call is the one ``decode_step`` makes (``model.layer(i,
X, state)`` with the state a step has: the ids up to its position, ``start`` at it), on the same
caches, so the logits equal :func:`dsv4.decode.loop.run_steps`'s. What differs is what can be timed:
a step is not one call here, so every step reports the loop's time divided by the number of steps.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Iterator, Sequence

import torch

from .. import probes
from ..model import DecodeState
from .loop import MemoryMeter, Step, check_request, model_devices


def run_steps_layer_major(model: Any, prompt: torch.Tensor, n_steps: int, forced: Sequence[int], *,
                          probe_steps: Sequence[int] = (), meter: MemoryMeter | None = None) -> Iterator[Step]:
    """The steps of ``run_steps(model, prompt, n_steps, forced=forced, probe_steps=...)``, computed layer by
    layer (module docstring); yields them once every layer has run."""
    config = model.config
    prompt = prompt.to("cpu", torch.int64).reshape(-1)
    if forced is None:
        raise ValueError("layer-major decode: expected forced tokens (teacher forcing), found None")
    check_request(config, int(prompt.numel()), n_steps, forced, probe_steps)
    meter = meter or MemoryMeter(model_devices(model))
    P = int(prompt.numel())
    fed = [int(t) for t in forced[: n_steps - 1]]                 # step s >= 1 feeds forced[s - 1]
    ids = torch.cat((prompt, torch.tensor(fed, dtype=torch.int64)))
    recs = {s: probes.ProbeRecorder(to_cpu=True) for s in probe_steps}
    with torch.no_grad():
        t0 = time.perf_counter()
        head_state = model.new_state(prompt)
        caches = head_state.layers
        states = [head_state] + [DecodeState(ids[: P + s], P - 1 + s, caches) for s in range(1, n_steps)]
        X: list[torch.Tensor] = []
        for s, st in enumerate(states):
            with recs.get(s) or nullcontext():
                X.append(model.embed(st.chunk))
        for i in range(len(model.blocks)):     # a step's recorder is entered once a layer: its values accumulate
            for s, st in enumerate(states):
                with recs.get(s) or nullcontext():
                    X[s] = model.layer(i, X[s], st)
        logits = []
        for s in range(n_steps):
            with recs.get(s) or nullcontext():
                logits.append(model.head(X[s])[-1])
            X[s] = None     # type: ignore[call-overload]
        meter.sync()
        secs = (time.perf_counter() - t0) / n_steps
        memory = meter.read()
    for s in range(n_steps):
        cpu = logits[s].detach().to("cpu", torch.float32).reshape(-1)
        rec = recs.get(s)
        yield Step(s, P - 1 + s, fed[s - 1] if s else None, int(forced[s]), cpu, secs, memory,
                   dict(rec.values) if rec else None)


__all__ = ["run_steps_layer_major"]
