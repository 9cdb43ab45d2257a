"""Where a test forward's probes live on a GPU run: on the device when they fit, else on the host.

The reference's probes, which anchor the first columns, are on the host. A test forward's probes
are compared once against them and dropped, so on a GPU they can stay where they were made: no
pinned host memory to allocate, no device-to-host copies competing with the forward, and the
comparison (on the GPU already, ``metrics.metric_device``) reads them in place. At DeepSeek-V4 Pro
width (2 layers, 1,024 tokens, 38 probes, 1.6 GB) capturing them to the host cost an H100
``cutedsl_sm90`` prefill 0.14 -> 0.55 s and an ``emulated`` one 1.02 -> 1.86 s
(``benchmarks/results/real_width_pro_h100_s3.json``, ``probe_capture``).

A host anchor (the reference's probes) goes up once per prompt when it fits beside the test side's
probes (``anchor_on_device``), read there by both modes' comparisons and the isolated forward, then
dropped; the host copy stays for the next column.

The emulated floor's outputs, which anchor the bug-budget column next, stay on the device too while
they fit beside the model that made them (the kernel backend's model, built next, needs about as
much); if it does not fit beside them after all, they move to the host and it is built again
(``threeway._Runner._load_native``). Then both sides of that column are compared on the device.

``fits_on_device(nbytes, device)``: twice the probes' bytes (the probes, then the comparison's own
temporaries) plus ``RESERVE`` within the device's free memory, read after the model is built. The
forward's own activations are not known here; a forward that runs out of memory anyway is retried with
the probes on the host (``run_with_home``), so the rule can only cost time, never a result.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, TypeVar

import torch

RESERVE = 2 << 30
T = TypeVar("T")


def probe_bytes(probes: Mapping[str, Any]) -> int:
    return sum(v.numel() * v.element_size() for v in probes.values() if isinstance(v, torch.Tensor))


def fits_on_device(nbytes: int, device: str | torch.device) -> bool:
    d = torch.device(device)
    if d.type != "cuda" or not torch.cuda.is_available():
        return False
    free, _ = torch.cuda.mem_get_info(d)
    return 2 * nbytes + RESERVE <= free


def run_with_home(run: Callable[[bool], T], on_device: bool, release: Callable[[], None]) -> tuple[T, bool]:
    """``run(on_device)``; if it runs out of device memory with the probes on the device, ``release()``
    and once more with them on the host. Returns (result, where the probes ended up: True = device)."""
    if not on_device:
        return run(False), False
    try:
        return run(True), True
    except torch.cuda.OutOfMemoryError:
        pass     # out of the except block first: its traceback holds the abandoned forward's tensors
    release()
    return run(False), False


def is_on_device(probes: Mapping[str, Any]) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in probes.values())


def anchor_on_device(probes: dict[str, Any], device: str | torch.device) -> dict[str, Any] | None:
    """Host anchor probes copied to the GPU for one prompt, or None (on the device already, not a GPU,
    or not room for them beside the test side's probes: ``fits_on_device`` of both). A column reads its
    anchor in every comparison (propagated and isolated) and its layer outputs in the isolated forward;
    from the host each of those reads was a host-to-device copy of its own."""
    if is_on_device(probes) or not fits_on_device(2 * probe_bytes(probes), device):
        return None
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in probes.items()}


def to_host(probes: dict[str, Any]) -> dict[str, Any]:
    """Device-resident probes moved to the host (those a later column anchors on)."""
    return {k: v.to("cpu") if isinstance(v, torch.Tensor) else v for k, v in probes.items()}
