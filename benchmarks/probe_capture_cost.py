"""What capturing every probe costs a forward on a GPU, and what pinned, non-blocking copies would save.

    probe_capture_cost(model, ids, device) -> dict      (bench_real_width.py calls it once per backend)

One prefill of ``ids`` three times, each synchronized before and after:

1. plain (no recorder: probes are not emitted);
2. as the harness records (``ProbeRecorder(to_cpu=True)``: each probe copied to pageable host memory
   when it is emitted, which waits for the GPU to reach it);
3. each probe copied into pinned host memory with ``non_blocking=True`` (one synchronization at the
   end), so the copies overlap the forward; the values are checked equal to those of 2.

with the bytes the probes hold on the host. On a CPU there is nothing to copy: the result says so.
Measured on an H100 at real width, the harness's forwards took 1.7 s against 0.14 s plain (Pro, 2
layers, 1,024 tokens, ``cutedsl_sm90``); this tells how much of that the copies are.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from dsv4.probes import ProbeRecorder


class PinnedRecorder(ProbeRecorder):
    """``ProbeRecorder`` that copies device tensors into pinned host memory without blocking; its
    values are valid after the device is synchronized."""

    def _take(self, name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.is_cuda and (self.include is None or self.include(name)):
            dst = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            dst.copy_(value.detach(), non_blocking=True)
            value = dst
        super()._take(name, value)


def host_bytes(values: dict[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in values.values() if isinstance(v, torch.Tensor))


def _timed(model: Any, ids: torch.Tensor, device: torch.device, rec: ProbeRecorder | None) -> float:
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with torch.no_grad(), rec if rec is not None else contextlib.nullcontext():
        model(ids)
    torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _same(a: Any, b: Any) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def probe_capture_cost(model: Any, ids: torch.Tensor, device: str | torch.device) -> dict[str, Any]:
    dev = torch.device(device)
    ids = ids.to(dev)
    if dev.type != "cuda":
        return {"tokens": int(ids.numel()), "skipped": f"device {dev}: probes stay where they are, nothing is copied"}
    plain = _timed(model, ids, dev, None)
    sync_rec = ProbeRecorder(to_cpu=True)
    pageable = _timed(model, ids, dev, sync_rec)
    pinned_rec = PinnedRecorder()
    pinned = _timed(model, ids, dev, pinned_rec)
    same = list(sync_rec.values) == list(pinned_rec.values) and all(
        _same(v, pinned_rec.values[n]) for n, v in sync_rec.values.items())
    return {"tokens": int(ids.numel()), "probes": len(sync_rec.values), "host_bytes": host_bytes(sync_rec.values),
            "plain_seconds": plain, "pageable_sync_seconds": pageable, "pinned_async_seconds": pinned,
            "pinned_equal": bool(same)}
