"""A harness column's forwards layer by layer over every prompt, for a streamed native model
(``dsv4.streamed``; and the reference's forwards when it reads its checkpoint from storage): each layer, once built, runs every prompt's propagated streams and the anchor's
input to it (isolated), and its probes are compared and dropped before the next layer is built. A column
then reads each layer from the checkpoint once, not once a prompt and mode, and holds one layer's probes a
prompt, not a whole forward's.

The calls are those of :func:`parity.runner.run_propagated` (a prefill is ``embed``, every ``layer``,
``head``: ``NativeModel._forward``) and :func:`parity.runner.run_isolated`, each (prompt, mode) with its
own state; every stage's probes go to ``compare_probes`` restricted to the anchor's probes of that stage
(before the first layer, layer ``i``, after the last), so an anchor probe the test side never emitted
still fails, and each prompt's records come out in the order a prompt-by-prompt column writes them.
Each mode's seconds are the sum of its own calls, synchronized after each. A forward that runs out of
memory is not retried with its probes on the host (one layer's probes a prompt are small).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from dsv4.probes import ProbeRecorder, layer_probe, parse_probe, suspended

from .errors import SurfaceError
from .logits_stats import PositionStats
from .probe_home import fits_on_device, probe_bytes, to_host
from .runner import SideOutput, _on_cpu, _sync, _trace_nonfinite

PROPAGATED, ISOLATED = "propagated", "isolated"
# compare(prompt index, mode, the stage's test probes, which anchor probes to compare) -> (records, stats)
Compare = Callable[[int, str, dict, Callable[[str], bool]], tuple[list[dict], PositionStats | None]]


@dataclass
class PromptOut:
    """One prompt's share of a layer-major column: the propagated output (its logits always; every probe
    when kept for a later column), each mode's seconds, records in prompt-by-prompt order, position stats."""

    out: SideOutput
    seconds: dict[str, float]
    records: list[dict] = field(default_factory=list)
    stats: dict[str, PositionStats] = field(default_factory=dict)
    compare_seconds: float = 0.0


def stages(anchor_probes: dict[str, Any], num_layers: int) -> dict[Any, Callable[[str], bool]]:
    """Predicates on probe names per stage: ``"pre"`` (before the first layer's probes, in the anchor's
    order), each layer index, ``"post"`` (the head's)."""
    pre: set[str] = set()
    post: set[str] = set()
    seen_layer = False
    for name in anchor_probes:
        layer, _ = parse_probe(name)
        if layer is not None:
            seen_layer = True
        else:
            (post if seen_layer else pre).add(name)
    out: dict[Any, Callable[[str], bool]] = {"pre": pre.__contains__, "post": post.__contains__}
    for i in range(num_layers):
        out[i] = lambda name, i=i: parse_probe(name)[0] == i
    return out


def run_prompts_layer_major(model: Any, ids: Sequence[torch.Tensor], anchors: Sequence[SideOutput] | None, *,
                            num_layers: int, device: str, modes: Sequence[str], compare: Compare | None, keep: bool,
                            host: bool = False, on_prompt: Callable[[int], None] = lambda n: None,
                            progress: Callable[[int, int], None] = lambda i, n: None) -> list[PromptOut]:
    """Every prompt's propagated forward (and isolated, when in ``modes``), layer by layer (module
    docstring). ``on_prompt(n)`` runs before each call for prompt ``n`` (the audit's prompt id);
    ``keep``: the propagated probes are kept whole (a later column's anchors; ``host``: on the host, as
    the reference's are). With no ``anchors`` nothing is compared (``modes`` and ``compare`` unused): the
    streamed reference's forwards, each layer read once for every prompt."""
    if anchors is None:
        modes, compare = (), None
    if ISOLATED in modes:
        missing = sorted({layer_probe(i, "out") for a in anchors for i in range(num_layers)
                          if layer_probe(i, "out") not in a.probes})
        if missing:
            raise SurfaceError(f"isolated mode needs the anchor's layer outputs, missing {missing}")
    run_modes = [PROPAGATED] + ([ISOLATED] if ISOLATED in modes else [])
    on_dev = not _on_cpu(device)
    ids_dev = [t.to(device) if on_dev else t for t in ids]
    P = len(ids)
    outs = [PromptOut(SideOutput({}, torch.empty(0)), {m: 0.0 for m in run_modes}) for _ in range(P)]
    recs: list[dict[str, list[dict]]] = [{m: [] for m in run_modes} for _ in range(P)]
    st_of = [stages(a.probes, num_layers) for a in anchors] if anchors is not None else []
    kept_bytes = 0

    def call(n: int, mode: str, fn: Any, *args: Any) -> tuple[Any, dict]:
        on_prompt(n)
        rec = ProbeRecorder(to_cpu=False)       # one stage's probes: compared where they are, then dropped
        _sync(device)
        t0 = time.perf_counter()
        with torch.no_grad(), rec, _trace_nonfinite(rec, mode):
            y = fn(*args)
        _sync(device)
        outs[n].seconds[mode] += time.perf_counter() - t0
        return y, dict(rec.values)

    def judge(n: int, stage: Any, mode: str, probes: dict) -> None:
        nonlocal kept_bytes
        if mode in modes and compare is not None:
            t0 = time.perf_counter()
            r, st = compare(n, mode, probes, st_of[n][stage])
            outs[n].compare_seconds += time.perf_counter() - t0
            recs[n][mode] += r
            if st is not None:
                outs[n].stats[mode] = st
        if mode == PROPAGATED:
            if keep:     # a later column's anchor: on the GPU while the kept ones fit there
                nbytes = probe_bytes(probes)
                if on_dev and (host or not fits_on_device(kept_bytes + nbytes, device)):
                    probes = to_host(probes)
                else:
                    kept_bytes += nbytes
                outs[n].out.probes.update(probes)
            elif "logits" in probes:
                outs[n].out.probes["logits"] = probes["logits"]

    states: list[dict[str, Any]] = [{} for _ in range(P)]
    X: list[Any] = [None] * P
    for n in range(P):
        for mode in run_modes:
            states[n][mode], _ = call(n, mode, model.new_state, ids_dev[n])
            x, probes = call(n, mode, model.embed, ids_dev[n])
            if mode == PROPAGATED:
                X[n] = x
            judge(n, "pre", mode, probes)
    for i in range(num_layers):
        progress(i, num_layers)
        for n in range(P):
            for mode in run_modes:
                inp = X[n] if mode == PROPAGATED else anchors[n].layer_input(i)
                y, probes = call(n, mode, model.layer, i, inp, states[n][mode])
                if mode == PROPAGATED:
                    X[n] = y
                judge(n, i, mode, probes)
    progress(num_layers, num_layers)
    for n in range(P):
        for mode in run_modes:
            inp = X[n] if mode == PROPAGATED else anchors[n].probes[layer_probe(num_layers - 1, "out")]
            logits, probes = call(n, mode, model.head, inp)
            if mode == PROPAGATED and ("logits" not in probes or tuple(logits.shape) != tuple(probes["logits"].shape)):
                raise SurfaceError(f"{type(model).__name__}: its head returned logits {tuple(logits.shape)}, its "
                                   f"'logits' probe {tuple(probes['logits'].shape) if 'logits' in probes else 'absent'}")
            judge(n, "post", mode, probes)
        X[n] = None
        with torch.no_grad(), suspended():
            outs[n].out.streams = model.embed(ids_dev[n]).detach().to("cpu")
        outs[n].out.seconds = {"forward": outs[n].seconds[PROPAGATED]}
        outs[n].records = [r for m in run_modes for r in recs[n][m]]
    return outs


__all__ = ["PromptOut", "run_prompts_layer_major", "stages"]
