"""Checkpoint I/O: lazy readers for every known layout (``layouts.py``), and synthetic checkpoints.

Public API: ``open_checkpoint(path, config=None) -> CheckpointReader`` with ``.flavor``, ``.layout``,
``.config``, ``.tensor_names()``, ``.get_tensor(name)``, ``.weight(name, layer=None) -> StoredWeight``
and ``.fingerprint()``. Dequantization is deliberately not here (docs/design.md principle 2).
The reader (torch, safetensors) is imported on first use, so the package's CLIs answer ``--help`` at once.
"""
from typing import Any

from .errors import CheckpointError

_LAZY = {"CheckpointReader": ".reader", "open_checkpoint": ".reader", "StoredWeight": ".formats",
         "WeightFormat": ".formats"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'dsv4.checkpoint' has no attribute {name!r}")


__all__ = ["CheckpointError", "CheckpointReader", "StoredWeight", "WeightFormat", "open_checkpoint"]
