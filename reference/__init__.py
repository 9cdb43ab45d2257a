"""The pure-PyTorch BF16 DeepSeek-V4 reference: the oracle of the project (spec §3-§12, §16).

It imports only compute-free parts of ``dsv4`` (config, checkpoint, probes, encoding/tokenizer);
never ``dsv4.layers``, ``dsv4.numerics``, ``dsv4.kernels`` or ``dsv4.model`` (design principle 2).
"""
from __future__ import annotations

from importlib import import_module

# Loaded on first use (PEP 562), so the CLIs under reference/ answer --help without importing torch.
_LAZY = {"load_model": ".model", "ReferenceModel": ".model", "ReferenceState": ".state",
         "Profile": ".profiles", "PROFILES": ".profiles", "get_profile": ".profiles"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'reference' has no attribute {name!r}")
    return getattr(import_module(_LAZY[name], __name__), name)

__all__ = ["load_model", "ReferenceModel", "ReferenceState", "Profile", "PROFILES", "get_profile"]
