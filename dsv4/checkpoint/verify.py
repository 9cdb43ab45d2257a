"""A full value scan of a checkpoint: every tensor, used by a prompt or not, read once.

``python -m dsv4.checkpoint.verify DIR`` — exit 0 clean, 2 with every finding named.

Findings: NaN/Inf in floating tensors; E8M0 scale code 255 (NaN: the format has no 2^128); FP8
E4M3 NaN codes (S.1111.111); NVFP4 global / input scales that are not finite and positive; E4M3
block scales with the sign bit set (a negative scale flips a block); hash-routing ids outside
[0, n_routed_experts). The parity CLIs run it before any compute for checkpoints up to
``DSV4_VALUE_SCAN_MAX_BYTES`` (default 8 GiB; 0 switches it off); bigger ones get this command.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch



SCAN_MAX_ENV = "DSV4_VALUE_SCAN_MAX_BYTES"
DEFAULT_SCAN_MAX = 8 << 30


@dataclass(frozen=True)
class Finding:
    tensor: str
    what: str
    count: int
    first: tuple[int, ...]   # index of the first bad element

    def __str__(self) -> str:
        return f"{self.tensor}: {self.what} ({self.count} element(s), first at {list(self.first)})"


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    idx = mask.nonzero()
    return tuple(int(i) for i in idx[0]) if len(idx) else ()


def _check(name: str, dtype: str, t: torch.Tensor, n_experts: int) -> list[Finding]:
    import torch

    out: list[Finding] = []

    def flag(mask: torch.Tensor, what: str) -> None:
        n = int(mask.sum())
        if n:
            out.append(Finding(name, what, n, _first(mask)))

    if dtype in ("BF16", "F16", "F32", "F64"):
        flag(~torch.isfinite(t), "not finite (NaN/Inf)")
        if name.endswith(("weight_scale_2", "input_scale", "weight_global_scale", "input_global_scale")):
            flag(torch.isfinite(t) & (t <= 0), "global/input scale not positive")
    elif dtype == "F8_E8M0" or (dtype == "U8" and name.endswith((".scale", ".weight_scale"))):   # UE8M0 bytes
        flag(t.view(torch.uint8) == 255, "E8M0 scale code 255 (NaN)")
    elif dtype == "F8_E4M3":
        b = t.view(torch.uint8)
        flag((b & 0x7F) == 0x7F, "FP8 E4M3 NaN code")
        if name.endswith(".weight_scale"):
            flag((b & 0x80) != 0, "negative E4M3 block scale")
    elif dtype in ("I64", "I32") and name.endswith("tid2eid"):
        flag((t < 0) | (t >= n_experts), f"expert id outside [0, {n_experts})")
    return out


def scan_values(reader: Any, progress: Callable[[int, int, str], None] | None = None) -> list[Finding]:
    """Every finding of every stored tensor of ``reader`` (a CheckpointReader)."""
    names = reader.tensor_names()
    findings: list[Finding] = []
    for i, name in enumerate(names):
        info = reader.tensor_info(name)
        findings += _check(name, info.dtype, reader.get_tensor(name), reader.config.n_routed_experts)
        if progress is not None:
            progress(i + 1, len(names), name)
    return findings


def stored_bytes(reader: Any) -> int:
    return sum(f.stat().st_size for f in reader._files)


def verify_before_compute(reader: Any) -> None:
    """The automatic scan of the parity CLIs: raise CheckpointError naming the findings (bad input)."""
    from .errors import CheckpointError

    limit = int(os.environ.get(SCAN_MAX_ENV, DEFAULT_SCAN_MAX))
    if limit <= 0 or stored_bytes(reader) > limit:
        return
    findings = scan_values(reader)
    if findings:
        raise CheckpointError(findings_message(findings))


def findings_message(findings: Iterable[Finding]) -> str:
    f = list(findings)
    more = f" (and {len(f) - 8} more tensors)" if len(f) > 8 else ""
    return ("value scan: expected finite weights and valid scale codes, found "
            + "; ".join(str(x) for x in f[:8]) + more + " (full list: python -m dsv4.checkpoint.verify)")


def main(argv: list[str] | None = None) -> int:
    from .errors import CheckpointError

    p = argparse.ArgumentParser(prog="python -m dsv4.checkpoint.verify", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", help="checkpoint directory or .safetensors file")
    a = p.parse_args(argv)
    from . import open_checkpoint

    try:
        reader = open_checkpoint(Path(a.checkpoint))
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = last = time.monotonic()

    def progress(done: int, total: int, name: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= 5.0 or done == total:   # plain lines: survives a pipe
            eta = (now - t0) / done * (total - done)
            print(f"[{time.strftime('%H:%M:%S')}] scanned {done}/{total} tensors ({name}); eta {eta:.0f} s",
                  file=sys.stderr, flush=True)
            last = now

    findings = scan_values(reader, progress)
    for f in findings:
        print(f"bad: {f}")
    print(f"{reader.path}: {len(reader.tensor_names())} tensors scanned, {len(findings)} with findings")
    return 2 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
