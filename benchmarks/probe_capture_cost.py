"""What capturing every probe costs a forward on a GPU: synchronous pageable copies against the
harness's pinned, non-blocking ones.

    probe_capture_cost(model, ids, device) -> dict      (bench_real_width.py calls it once per backend)

One prefill of ``ids`` three times, each synchronized before and after:

1. plain (no recorder: probes are not emitted);
2. each probe copied to pageable host memory when it is emitted, which waits for the GPU to reach it
   (``PageableRecorder``: the harness's recorder until the measurement below);
3. as the harness records now (``ProbeRecorder(to_cpu=True)``): each probe copied into pinned host
   memory with ``non_blocking=True``, one synchronization at the end, so the copies overlap the
   forward; the values are checked equal to those of 2.

with the bytes the probes hold on the host. On a CPU there is nothing to copy: the result says so.
Measured on an H200 at real width (Pro, 2 layers, 1,024 tokens, 38 probes, 1.6 GB on the host):
``cutedsl_sm90`` 0.13 s plain, 0.57 s pageable, 0.16 s pinned; ``emulated`` 0.90 / 1.30 / 1.33 s
(its forward reads the host anyway: nothing overlaps).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from dsv4.probes import ProbeRecorder


class PageableRecorder(ProbeRecorder):
    """What ``ProbeRecorder(to_cpu=True)`` did before it used pinned copies: each probe copied to
    pageable host memory when it is emitted, which waits for the GPU to reach it."""

    def _to_host(self, value: Any) -> Any:
        return value.to("cpu")


def host_bytes(values: dict[str, Any]) -> int:
    from parity.probe_home import probe_bytes

    return probe_bytes(values)


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
    sync_rec = PageableRecorder(to_cpu=True)
    pageable = _timed(model, ids, dev, sync_rec)
    pinned_rec = ProbeRecorder(to_cpu=True)
    pinned = _timed(model, ids, dev, pinned_rec)
    same = list(sync_rec.values) == list(pinned_rec.values) and all(
        _same(v, pinned_rec.values[n]) for n, v in sync_rec.values.items())
    return {"tokens": int(ids.numel()), "probes": len(sync_rec.values), "host_bytes": host_bytes(sync_rec.values),
            "plain_seconds": plain, "pageable_sync_seconds": pageable, "pinned_async_seconds": pinned,
            "pinned_equal": bool(same)}
