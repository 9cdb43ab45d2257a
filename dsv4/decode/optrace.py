"""Op traces of decode steps, and what differs between two consecutive steps.

A CUDA graph replays the kernels of the step it captured, with that step's shapes and scalar
arguments. So an op is graph-unsafe when, from one step to the next, its output shape changes (a
cache growing by ``cat``, a slice ``[lo:hi]`` of a window) or a Python scalar argument changes (an
``arange(start, ...)`` of the position, an index derived from it: the graph would replay the captured
step's value — stale data, not an error). Other ops are unsafe on any step: data-dependent output
sizes (``nonzero``, ``bincount`` on CUDA), reads of a device value on the host (``item``), copies
from pageable host memory.

:class:`OpTracer` records every ATen op of a step (a ``TorchDispatchMode``; works on the CPU too)
with its innermost ``dsv4/`` source line; :func:`diff_steps` aligns two steps' ops by (source line,
op, occurrence) and lists the differences. The diff is pure logic over :class:`OpEvent` lists.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .where import OBSERVERS, PACKAGE_ROOT

# Ops whose output size depends on tensor values (a host sync on CUDA, and no graph can capture them).
DATA_DEPENDENT = ("aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique", "aten.bincount",
                  "aten.histc", "aten.repeat_interleave", "aten.index_select_backward", "aten._local_scalar_dense")


@dataclass(frozen=True)
class OpEvent:
    op: str                                 # "aten.cat.default"
    location: str                           # "dsv4/layers/kv_cache.py:34 (cat)" or "<outside dsv4>"
    shapes: tuple[tuple[int, ...], ...]     # output tensor shapes
    scalars: tuple[Any, ...]                # non-tensor leaves of the arguments (ints, floats, bools)
    devices: tuple[str, ...] = ()           # devices of the input tensors, then of the outputs


@dataclass(frozen=True)
class Finding:
    kind: str                  # step_shape | step_scalar | data_dependent | host_copy | control_flow
    location: str
    op: str
    detail: str
    count: int = 1


def _location(root: Path = PACKAGE_ROOT) -> str:
    """Innermost frame inside ``dsv4/`` (observers excluded) of the current Python stack."""
    parent = str(root.parent) + "/"
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(parent):
            rel = fn[len(parent):]
            if rel.startswith(root.name + "/") and not any(rel.endswith(s) for s in OBSERVERS):
                return f"{rel}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return "<outside dsv4>"


class OpTracer(TorchDispatchMode):
    """``with OpTracer() as t: model.decode_step(...)`` -> ``t.events``."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[OpEvent] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        leaves, _ = tree_flatten((args, kwargs))
        outs, _ = tree_flatten(out)
        scalars = tuple(x for x in leaves if isinstance(x, (int, float, bool)) and not isinstance(x, torch.Tensor))
        devs = tuple(str(x.device) for x in leaves if isinstance(x, torch.Tensor)) + \
            tuple(str(x.device) for x in outs if isinstance(x, torch.Tensor))
        shapes = tuple(tuple(x.shape) for x in outs if isinstance(x, torch.Tensor))
        self.events.append(OpEvent(str(func.overloadpacket) + "." + func._overloadname, _location(), shapes,
                                   scalars, devs))
        return out


def _same(u: Any, v: Any) -> bool:
    return u == v or (isinstance(u, float) and isinstance(v, float) and u != u and v != v)   # NaN == NaN here


def _keyed(events: Sequence[OpEvent]) -> dict[tuple[str, str, int], OpEvent]:
    seen: Counter = Counter()
    out = {}
    for e in events:
        k = (e.location, e.op)
        out[(e.location, e.op, seen[k])] = e
        seen[k] += 1
    return out


def _host_copy(e: OpEvent) -> bool:
    ins = e.devices[:len(e.devices) - len(e.shapes)]
    outs = e.devices[len(e.devices) - len(e.shapes):]
    return any(d == "cpu" for d in ins) and any(d.startswith("cuda") for d in outs)


def diff_steps(a: Sequence[OpEvent], b: Sequence[OpEvent]) -> list[Finding]:
    """What keeps two consecutive steps from sharing one graph, grouped by (kind, location, op)."""
    return group(_diff(a, b))


def diff_many(steps: Sequence[Sequence[OpEvent]]) -> list[Finding]:
    """Findings over every consecutive pair of steps (a cache that grows only when a compressor block
    closes shows up only in the pair that straddles the close)."""
    raw: list[tuple[str, str, str, str]] = []
    for a, b in zip(steps, steps[1:]):
        raw += _diff(a, b)
    return group(raw)


def _diff(a: Sequence[OpEvent], b: Sequence[OpEvent]) -> list[tuple[str, str, str, str]]:
    ka, kb = _keyed(a), _keyed(b)
    raw: list[tuple[str, str, str, str]] = []
    for key in ka.keys() & kb.keys():
        x, y = ka[key], kb[key]
        if x.shapes != y.shapes:
            raw.append(("step_shape", key[0], key[1], f"{list(x.shapes)} -> {list(y.shapes)}"))
        elif len(x.scalars) != len(y.scalars) or not all(map(_same, x.scalars, y.scalars)):
            diff = [f"{u}->{v}" for u, v in zip(x.scalars, y.scalars) if not _same(u, v)] or \
                   [f"{len(x.scalars)} -> {len(y.scalars)} scalars"]
            raw.append(("step_scalar", key[0], key[1], ", ".join(diff[:4])))
    for key in ka.keys() ^ kb.keys():
        where = "first" if key in ka else "second"
        raw.append(("control_flow", key[0], key[1], f"runs in the {where} step only"))
    for e in [*a, *b]:
        if e.op.rsplit(".", 1)[0] in DATA_DEPENDENT:
            raw.append(("data_dependent", e.location, e.op, "output size / value read depends on the data"))
        elif _host_copy(e):
            raw.append(("host_copy", e.location, e.op, "copy from host memory into a device tensor"))
    return raw


def _function(location: str) -> str:
    """``dsv4/x.py:12 (f)`` -> ``dsv4/x.py (f)``."""
    path, _, rest = location.partition(":")
    return f"{path} {rest.partition(' ')[2]}".strip() if rest else location


def group(raw: Iterable[tuple[str, str, str, str]]) -> list[Finding]:
    """One finding per (kind, location), naming its ops and counting occurrences. Control-flow
    differences are grouped per function: a compressor block closing runs dozens of extra ops in the
    norm and RoPE helpers, which is one finding, not one per op."""
    counts: Counter = Counter()
    ops: dict[tuple[str, str], list[str]] = {}
    first: dict[tuple[str, str], str] = {}
    for kind, loc, op, detail in raw:
        k = (kind, _function(loc) if kind == "control_flow" else loc)
        counts[k] += 1
        ops.setdefault(k, [])
        if op not in ops[k]:
            ops[k].append(op)
        first.setdefault(k, detail)
    order = {"data_dependent": 0, "host_copy": 1, "step_shape": 2, "step_scalar": 3, "control_flow": 4}

    def label(k: tuple[str, str]) -> str:
        names = [o.removeprefix("aten.") for o in ops[k]]
        return ", ".join(names[:3]) + (f" (+{len(names) - 3})" if len(names) > 3 else "")

    return sorted((Finding(k[0], k[1], label(k), first[k], counts[k]) for k in counts),
                  key=lambda f: (order.get(f.kind, 9), f.location, f.op))


def on_device(events: Iterable[OpEvent]) -> list[OpEvent]:
    """Events touching a CUDA tensor: host-side bookkeeping (token ids on the CPU) never enters a graph."""
    return [e for e in events if any(d.startswith("cuda") for d in e.devices)]


def trace_steps(model: Any, state: Any, tokens: Sequence[int], *, device_only: bool = False) -> list[list[OpEvent]]:
    """One op trace per ``model.decode_step(state, token)`` (``state`` advances)."""
    out = []
    with torch.no_grad():
        for tok in tokens:
            with OpTracer() as t:
                model.decode_step(state, tok)
            out.append(on_device(t.events) if device_only else t.events)
    return out
