"""The GPU time inside a decode step: its kernels' durations, summed, from the CUDA profiler (CUPTI).

Issue #43's target for a native decode step is a wall time within 3x of its summed kernel time: what
the host adds (Python, dispatch, launches, syncs) at most twice the device's own work. ``device_work``
runs a step function under ``torch.profiler`` with CUDA activities and returns, per step, the summed
durations of the device's activities (kernels, memcpy, memset: each is device work the step asked for)
and their busy time (the union of their intervals: below the sum where streams overlap). Kernels
replayed from a CUDA graph are traced one by one like eager ones. Pure interval arithmetic in
``busy_us`` so it is tested without a GPU.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable


def busy_us(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end)`` intervals (microseconds); empty or inverted ones add 0."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def device_work(step: Callable[[], Any], steps: int) -> dict[str, float]:
    """Run ``step`` ``steps`` times under the CUDA profiler; per step: summed device ms, busy ms, and how
    many device activities (kernels, copies, memsets) ran. The caller synchronizes inside ``step`` or not:
    the profile is flushed with a device sync before it is read."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"steps: expected >= 1, found {steps}")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA]
    return {"kernel_ms_per_step": sum(e - s for s, e in spans) / 1e3 / steps,
            "busy_ms_per_step": busy_us(spans) / 1e3 / steps,
            "device_activities_per_step": len(spans) / steps}
