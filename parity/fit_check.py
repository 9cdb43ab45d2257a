"""Before a run's first forward: will the native models it builds fit their GPUs at all?

The reference streams one layer at a time, so it fits; the native model is built whole on its devices
(``--device-map`` spreads its layers). A full DeepSeek-V4 Pro (828 GiB of NVFP4 weights) on one 80 GB
card would only fail once the reference's forwards are done, which at real size is hours of streaming
later. This check compares, per GPU, the weights each native model of the run places there
(``parity.memory.model_weights``: the dry run's figures) with the card's total memory, and stops with
one error naming the model, the device, both sizes and the way out. It rejects only what cannot fit
(weights alone above the card's total), never a run that might.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from .errors import ParityInputError


def device_memory(device: str) -> int | None:
    """Total bytes of a CUDA device (None for the CPU, or with no CUDA)."""
    d = torch.device(device)
    if d.type != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(d.index if d.index is not None else 0).total_memory)


def _canonical(device: Any) -> str:
    """``cuda`` and ``cuda:0`` are one device (their weights add up); the device map itself is validated
    where the model is built."""
    d = torch.device(device)
    return f"cuda:{d.index or 0}" if d.type == "cuda" else str(d)


def native_models(columns: Sequence[str], plan: Any) -> list[tuple[str, Any]]:
    """(label, plan) of each native model a run of ``columns`` builds: the logic column's FP32 model, and
    the plan's model (the floor column's, which the bug-budget column runs on its kernel backend)."""
    from dsv4.plan import PrecisionPlan

    out = []
    if "logic" in columns:
        out.append(("native all-fp32 (logic)", PrecisionPlan.preset("all-fp32")))
    if "floor" in columns or "bug_budget" in columns:
        out.append((f"native {plan.name} (floor / bug budget)", plan))
    return out


def check_native_fits(config: Any, plan: Any, columns: Sequence[str], device: str,
                      device_map: Mapping[Any, str] | None = None,
                      memory_of: Callable[[str], int | None] | None = None) -> None:
    """Raise ``ParityInputError`` when a native model of a run of ``columns`` has more weights on one of
    its devices than that device holds (``memory_of``: a device's total bytes, default
    :func:`device_memory`)."""
    memory_of = memory_of or device_memory
    from .memory import model_weights

    models = native_models(columns, plan)
    if not models:
        return
    keys: list[Any] = ["embed", *range(config.num_hidden_layers), "head"]
    devices = {k: _canonical((device_map or {}).get(k, device)) for k in keys}
    gpus = sorted({str(d) for d in devices.values()})
    for name, p in models:
        est = model_weights(config, devices, p)
        total = est.total
        for dev, nbytes in sorted(est.per_device.items()):
            have = memory_of(dev)
            if have is None or nbytes <= have:
                continue
            need = -(-total // have)
            raise ParityInputError(
                f"{name}: {nbytes / 2**30:.1f} GiB of weights on {dev}, which holds {have / 2**30:.1f} GiB in all: "
                f"expected a device map spreading its {total / 2**30:.0f} GiB over at least {need} such GPUs "
                f"(--device-map; --dry-run prints the plan), found {len(gpus)} device(s) {gpus}. The native model "
                f"is built whole, unlike the streamed reference"
                + ("; or leave out the logic column (--columns floor,bug_budget), whose FP32 model is the largest"
                   if "(logic)" in name else ""))


__all__ = ["check_native_fits", "device_memory", "native_models"]
