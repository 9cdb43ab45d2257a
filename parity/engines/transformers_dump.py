"""Probe dumps from transformers' own DeepSeek-V4 (``DeepseekV4ForCausalLM``), through forward hooks
on its modules (the table in :mod:`parity.engines.transformers_map`); nothing of transformers is
patched. ``python -m parity.compare_dumps --dumps DIR --checkpoint CKPT`` then judges the dump
against the reference; CKPT is the same weights in any layout the project reads (transformers'
``save_pretrained`` output is the ``hf`` layout)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from .transformers_map import GLOBAL_PROBES, LAYER_PROBES


def _layout(t: torch.Tensor, layout: str, n_heads: int) -> torch.Tensor:
    if layout == "rows":
        return t
    t = t[0]                               # batch of one
    if layout == "heads":
        return t.transpose(0, 1)
    if layout == "groups":
        return t.reshape(t.shape[0], n_heads, -1)
    return t


def capture(model: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Run ``model`` on one prompt ``ids`` [T] (no cache) and return {probe name: tensor} for every
    probe of the table, detached on the CPU."""
    cfg = model.config
    if ids.dim() != 1:
        raise ValueError(f"capture: expected token ids [T], found shape {list(ids.shape)}")
    mods = dict(model.named_modules())
    got: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(probe: str, t: Any, layout: str) -> None:
        t = t[0] if isinstance(t, tuple) else t
        got[probe] = _layout(t.detach(), layout, cfg.num_attention_heads).to("cpu")

    def hook(probe: str, path: str, kind: str, layout: str) -> None:
        if path not in mods:
            raise ValueError(f"transformers model: expected a module {path!r} for probe {probe!r} "
                             f"(parity/engines/transformers_map.py), found none; another transformers version?")
        m = mods[path]
        if kind == "out":
            hooks.append(m.register_forward_hook(lambda _m, _i, o: keep(probe, o, layout)))
        else:
            hooks.append(m.register_forward_pre_hook(lambda _m, i: keep(probe, i[0], layout)))

    try:
        for i in range(cfg.num_hidden_layers):
            for suffix, path, kind, layout in LAYER_PROBES:
                hook(f"layers.{i}.{suffix}", f"model.layers.{i}" + (f".{path}" if path else ""), kind, layout)
        for probe, path, kind, layout in GLOBAL_PROBES:
            hook(probe, path, kind, layout)
        with torch.no_grad():
            model(ids[None].to(next(model.parameters()).device), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    got["logits"] = got["logits"].float()
    return got


def dump_transformers(model: Any, ids: Sequence[int] | torch.Tensor, out: str | Path, *, prompt_mode: str = "chat",
                      prompt_id: str | None = None, prompt_text: str | None = None) -> Path:
    """One dump directory for one prompt: the probes of the table, declared as a subset."""
    import transformers
    from ..dumps import write_dump

    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
    return write_dump(out, capture(model, ids), engine=f"transformers-{transformers.__version__}",
                      token_ids=ids.tolist(), prompt_mode=prompt_mode, prompt_id=prompt_id, prompt_text=prompt_text,
                      probe_subset=True)
