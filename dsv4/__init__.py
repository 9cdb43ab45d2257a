"""dsv4-parity: DeepSeek-V4 in NVFP4, checked against a BF16 reference.

``import dsv4`` stays cheap: ``load_model`` (which pulls torch and the layers) is imported lazily.
"""
from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from .model import load_model

        return load_model
    raise AttributeError(f"module 'dsv4' has no attribute {name!r}")
