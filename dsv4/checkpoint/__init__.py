"""Checkpoint I/O: lazy readers for the official, nvidia-nvfp4 and hf flavors, and synthetic checkpoints.

Public API: ``open_checkpoint(path, config=None) -> CheckpointReader`` with ``.flavor``, ``.config``,
``.tensor_names()``, ``.get_tensor(name)``, ``.weight(name, layer=None) -> StoredWeight`` and
``.fingerprint()``. Dequantization is deliberately not here (design principle 2).
"""
from .errors import CheckpointError
from .formats import StoredWeight, WeightFormat
from .reader import CheckpointReader, open_checkpoint

__all__ = ["CheckpointError", "CheckpointReader", "StoredWeight", "WeightFormat", "open_checkpoint"]
