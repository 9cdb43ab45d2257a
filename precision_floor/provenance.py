"""What a study was measured on, written beside its summary so the report can say it without the
checkpoint: checkpoint and config, code version and git SHA, device, library versions, backends
(kernel backends that only compile here are marked so), the prompts."""
from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from dsv4.kernels.registry import available_backends
from parity.env import code_version, device_name, versions
from parity.inputs import EncodedPrompt
from parity.source import CheckpointSource

_REPO = Path(__file__).resolve().parent.parent


def git_sha() -> str:
    try:
        out = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def backends(device: str) -> list[dict[str, Any]]:
    """Every registered backend, whether it executes on ``device``, and its note (e.g. a CuTe DSL
    backend on a machine without its GPU: 'compiled, not executed here')."""
    dev = torch.device(device)
    return [{"name": i.name, "priority": i.priority, "executes_here": bool(i.supports(dev)), "note": i.note}
            for i in sorted(available_backends().values(), key=lambda i: (-i.priority, i.name))]


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    return v


def provenance(source: CheckpointSource, prompts: Sequence[EncodedPrompt], device: str) -> dict[str, Any]:
    cfg = {k: _plain(v) for k, v in dataclasses.asdict(source.config).items()}
    return {
        "checkpoint": {"spec": source.spec, "path": str(source.path), "fingerprint": source.fingerprint,
                       "flavor": source.reader.flavor, "seed": source.seed},
        "config": cfg,
        "code_version": code_version(), "git_sha": git_sha(),
        "device": device_name(device), "versions": dict(versions()), "backends": backends(device),
        "prompts": [{"id": p.id, "mode": p.mode, "tokens": p.n_tokens} for p in prompts],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


__all__ = ["backends", "git_sha", "provenance"]
