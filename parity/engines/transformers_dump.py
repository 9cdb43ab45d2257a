"""Probe dumps from transformers' own DeepSeek-V4 (``DeepseekV4ForCausalLM``), through forward hooks
on its modules (the table in :mod:`parity.engines.transformers_map`); nothing of transformers is
patched. ``python -m parity.compare_dumps --dumps DIR --checkpoint CKPT`` then judges the dump
against the reference; CKPT is the same weights in any layout the project reads (transformers'
``save_pretrained`` output is the ``hf`` layout)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from .hooks import capture as capture_rows, layer_rows
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
    rows = layer_rows(LAYER_PROBES, "model.layers", cfg.num_hidden_layers) + list(GLOBAL_PROBES)
    got = capture_rows(model, rows, lambda: model(ids[None].to(next(model.parameters()).device), use_cache=False),
                       table="parity/engines/transformers_map.py",
                       layout_fn=lambda t, layout: _layout(t, layout, cfg.num_attention_heads))
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
