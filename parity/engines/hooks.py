"""Forward hooks from a probe table: the mechanism every engine adapter shares.

A table row is ``(probe, module path, "out" | "in", layout)``; :func:`layer_rows` expands per-layer
rows (``{i}`` = the layer index, ``offset`` added to the probe's layer for stages that continue the
layer numbering, as DSpark's do), :func:`fill_rows` fills placeholders such as ``{last}``.
:func:`capture` registers the hooks on any ``torch.nn.Module``
tree, runs the engine once through ``run()`` and returns ``{probe: tensor}`` on the CPU. A module the
table names but the model lacks is one error naming the table and the engine version."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

Row = tuple[str, str, str, str]


def layer_rows(suffixes: Sequence[Row], layers_path: str, n_layers: int, *, offset: int = 0) -> list[Row]:
    """Per-layer rows for layers 0..n-1 under ``layers_path`` ('' path = the layer itself)."""
    return [(f"layers.{i + offset}.{suffix}", f"{layers_path}.{i}" + (f".{path}" if path else ""), kind, layout)
            for i in range(n_layers) for suffix, path, kind, layout in suffixes]


def fill_rows(rows: Sequence[Row], **names: int) -> list[Row]:
    """Rows with ``{name}`` placeholders in their module paths filled in (``last`` = the last stage)."""
    return [(probe, path.format(**names), kind, layout) for probe, path, kind, layout in rows]


def capture(model: torch.nn.Module, rows: Sequence[Row], run: Callable[[], Any], *, table: str,
            layout_fn: Callable[[torch.Tensor, str], torch.Tensor] = lambda t, layout: t) -> dict[str, torch.Tensor]:
    mods = dict(model.named_modules())
    got: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(probe: str, t: Any, layout: str) -> None:
        t = t[0] if isinstance(t, (tuple, list)) else t
        got[probe] = layout_fn(t.detach(), layout).to("cpu")

    try:
        for probe, path, kind, layout in rows:
            m = mods.get(path)
            if m is None:
                raise ValueError(f"{type(model).__name__}: expected a module {path!r} for probe {probe!r} ({table}), "
                                 f"found none; another engine version?")
            if kind == "out":
                hooks.append(m.register_forward_hook(lambda _m, _i, o, p=probe, l=layout: keep(p, o, l)))
            else:
                hooks.append(m.register_forward_pre_hook(lambda _m, i, p=probe, l=layout: keep(p, i[0], l)))
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return got
