"""Before a run's first forward: will the native models it builds fit their GPUs at all?

The reference streams one layer at a time, so it fits. The native model is built whole on its devices
(``--device-map`` spreads its layers) unless it is larger than its one GPU: then it streams too
(``dsv4.streamed``: layers built when a forward reaches them, those that fit kept), which
:func:`streams_native` decides and ``runner.DefaultLoaders`` follows. A full DeepSeek-V4 Pro (828 GiB of
NVFP4 weights) spread by a device map over too few cards would only fail once the reference's forwards
are done, which at real size is hours of streaming later; so would a streamed model one of whose layers
(with the embedding and the head, which stay) is larger than the card. This check compares, per GPU, the
weights each native model of the run places there (``parity.memory.model_weights``: the dry run's
figures) with the card's total memory, and stops with one error naming the model, the device, both sizes
and the way out. It rejects only what cannot fit, never a run that might.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from .errors import ParityInputError

STREAM_ABOVE = 0.9   # a one-GPU native model streams when its weights exceed this share of the card (the rest:
                     # activations, probes, the CUDA context; parity.verdict_fit.USABLE is the same assumption)


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


def _keys(config: Any) -> list[Any]:
    return ["embed", *range(config.num_hidden_layers), "head"]


def part_bytes(config: Any, plan: Any) -> dict[str, int]:
    """Weight bytes of each part of the native model of ``plan``: ``"embed"``, ``"head"``, ``"0"``... (the
    dry run's figures, ``parity.memory.model_weights``, one pseudo-device a part)."""
    from .memory import model_weights

    return dict(model_weights(config, {k: str(k) for k in _keys(config)}, plan).per_device)


def streams_native(config: Any, plan: Any, device: str, device_map: Mapping[Any, str] | None = None,
                   memory_of: Callable[[str], int | None] | None = None) -> bool:
    """True when the native model of ``plan`` is built streamed (``dsv4.streamed``): one device, no device
    map, and weights above ``STREAM_ABOVE`` of that device's memory."""
    if device_map:
        return False
    have = (memory_of or device_memory)(_canonical(device))
    if have is None:
        return False
    return sum(part_bytes(config, plan).values()) > STREAM_ABOVE * have


def streamed_floor(config: Any, plan: Any) -> tuple[int, Any, int]:
    """(bytes a streamed model needs at least: embedding + head + its largest layer, that layer, its bytes)."""
    parts = part_bytes(config, plan)
    layer = max(range(config.num_hidden_layers), key=lambda i: parts.get(str(i), 0))
    largest = parts.get(str(layer), 0)
    return parts.get("embed", 0) + parts.get("head", 0) + largest, layer, largest


def check_native_fits(config: Any, plan: Any, columns: Sequence[str], device: str,
                      device_map: Mapping[Any, str] | None = None,
                      memory_of: Callable[[str], int | None] | None = None) -> None:
    """Raise ``ParityInputError`` when a native model of a run of ``columns`` has more weights on one of
    its devices than that device holds (``memory_of``: a device's total bytes, default
    :func:`device_memory`); a streamed model, when its embedding, head and largest layer do not fit."""
    memory_of = memory_of or device_memory
    from .memory import model_weights

    models = native_models(columns, plan)
    if not models:
        return
    devices = {k: _canonical((device_map or {}).get(k, device)) for k in _keys(config)}
    gpus = sorted({str(d) for d in devices.values()})
    for name, p in models:
        if streams_native(config, p, device, device_map, memory_of):
            need, layer, largest = streamed_floor(config, p)
            have = memory_of(_canonical(device)) or 0
            if need > have:
                raise ParityInputError(
                    f"{name}: streamed on {_canonical(device)} ({have / 2**30:.1f} GiB), it needs its embedding, "
                    f"head and largest layer (layer {layer}, {largest / 2**30:.1f} GiB) at once, "
                    f"{need / 2**30:.1f} GiB: expected a larger GPU or a device map over several "
                    f"(--device-map; --dry-run prints the plan), found one device"
                    + _logic_hint(name))
            continue
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
                f"(--device-map; --dry-run prints the plan), found {len(gpus)} device(s) {gpus}. A device map "
                f"builds the native model whole (on one GPU without a map, it streams)" + _logic_hint(name))


def _logic_hint(name: str) -> str:
    return ("; or leave out the logic column (--columns floor,bug_budget), whose FP32 model is the largest"
            if "(logic)" in name else "")


__all__ = ["STREAM_ABOVE", "check_native_fits", "device_memory", "native_models", "part_bytes", "streamed_floor",
           "streams_native"]
