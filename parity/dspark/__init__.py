"""Draft parity for the DSpark speculative module of the 0731/0813 releases (docs/dspark.md): the
door is ``run_draft_parity`` (``parity.dspark.run``) judged by ``parity.dspark.judge.judge``; the
CLI is ``python -m parity.dspark`` (``calibrate`` writes the floor rules, ``zoo`` runs the faults)."""
from __future__ import annotations

__all__ = ["run_draft_parity", "DraftSpec"]


def __getattr__(name: str):   # lazy: `--help` must not import torch
    if name in __all__:
        from . import run

        return getattr(run, name)
    raise AttributeError(name)
