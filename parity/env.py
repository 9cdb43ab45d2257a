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


def cpu_name() -> str:
    """The CPU model and the vector extensions its float kernels may use (which decide FP32/BF16
    summation order, hence the clean noise a calibration measures), e.g. ``Intel Xeon (avx512f, amx)``."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_fp16", "amx_bf16") if f in flags]
    return f"{model} ({', '.join(isa)})" if isa else model
