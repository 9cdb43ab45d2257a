"""What a record says about the environment: code version, library versions, the best device."""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

_REPO = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``git describe --always --dirty`` of the repository, else the installed package version.

    A dirty tree is marked so records measured on uncommitted code are recognisable."""
    try:
        out = subprocess.run(["git", "-C", str(_REPO), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return "pkg-" + metadata.version("dsv4-parity")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Library versions that can change numerics (kept short: it is repeated on every record)."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    for dist in ("numpy", "nvidia-cutlass-dsl"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


def best_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_name(device: str) -> str:
    """``cpu`` or ``cuda:0 (NVIDIA H200)``: what the record's ``device`` field holds."""
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available():
        idx = d.index if d.index is not None else torch.cuda.current_device()
        return f"cuda:{idx} ({torch.cuda.get_device_name(idx)})"
    return str(d)
