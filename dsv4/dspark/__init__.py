"""The native NVFP4 DSpark draft of the 0731/0813 releases (docs/dspark.md): its stage blocks, join,
hc-head collapse, Markov and confidence heads built under the precision plan's ``draft_*`` classes,
on the target's kernel dispatchers. ``load_dspark(target)`` is the one door."""
from __future__ import annotations

from .draft import Draft, DraftState, NativeDSpark, SpecResult, load_dspark

__all__ = ["Draft", "DraftState", "NativeDSpark", "SpecResult", "load_dspark"]
