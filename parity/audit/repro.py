"""A violating kernel call as a file: its exact operands (safetensors) and a JSON header naming where it
ran (module, layer, component, call index, backend, plan entry) and what broke. ``replay`` reruns the one
call through a backend and the oracle, without the model: a kernel engineer gets a unit test.

Tensor keys: ``request.<field>`` and, for FP4 operands, ``request.<a|b>.<packed|scales|global_scale>``;
``output.*`` holds what the backend returned when the violation was seen. Header key ``dsv4_parity_repro``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from dsv4.kernels.contract import (ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest,
                                   KernelContractError)
from dsv4.layers.dispatch import KernelCall

from ..errors import ParityInputError
from .auditor import Violation
from .calls import CallCheck, audit_request

FORMAT = "dsv4-parity-kernel-repro"
FORMAT_VERSION = 1
HEADER_KEY = "dsv4_parity_repro"
_OPERANDS = {"gemm": ("a", "b"), "grouped_gemm": ("a", "b"), "quantize_activation": ()}
_REQUEST_TENSORS = {"gemm": (), "grouped_gemm": ("offsets", "alphas"),
                    "quantize_activation": ("x", "global_scale", "rms_weight")}
_REQUEST_SCALARS = {"gemm": ("swiglu_limit",), "grouped_gemm": ("swiglu_limit",),
                    "quantize_activation": ("rms_eps", "scale_layout", "recipe")}


class ReproError(ParityInputError):
    """A repro file that cannot be read back into a kernel call (exit 2)."""


def _operand_tensors(prefix: str, op: FP4Operand) -> dict[str, torch.Tensor]:
    return {f"{prefix}.packed": op.packed, f"{prefix}.scales": op.scales, f"{prefix}.global_scale": op.global_scale}


def _flatten(kind: str, request: Any, output: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for name in _OPERANDS[kind]:
        op = getattr(request, name)
        tensors.update(_operand_tensors(f"request.{name}", op))
        scalars[f"{name}.k"], scalars[f"{name}.scale_layout"] = op.k, op.scale_layout
    for name in _REQUEST_TENSORS[kind]:
        t = getattr(request, name)
        if t is not None:
            tensors[f"request.{name}"] = t
    for name in _REQUEST_SCALARS[kind]:
        scalars[name] = getattr(request, name)
    if isinstance(output, FP4Operand):
        tensors.update(_operand_tensors("output", output))
        scalars["output.k"], scalars["output.scale_layout"] = output.k, output.scale_layout
    else:
        tensors["output"] = output
    return {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, scalars


def export_repro(path: str | Path, call: KernelCall, violation: Violation, *, plan_entry: str = "",
                 device: str = "") -> Path:
    """Write one violating call (operands on the host) as a repro file; returns the path."""
    from safetensors.torch import save_file

    tensors, scalars = _flatten(call.op, call.request, call.output)
    header = {"format": FORMAT, "format_version": FORMAT_VERSION, "op": call.op, "module": call.module,
              "component": call.component, "layer": violation.layer, "call_index": violation.call_index,
              "backend": call.backend, "device": device, "plan_entry": plan_entry, "scalars": scalars,
              "prompt_id": violation.prompt_id, "violation": violation.summary()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={HEADER_KEY: json.dumps(header, default=float)})
    return path


def load_repro(path: str | Path, device: str = "cpu") -> tuple[dict[str, Any], KernelCall]:
    """The header and the call (request rebuilt on ``device``; ``output`` the recorded one)."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise ReproError(f"repro {p}: expected an existing file, found none")
    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k).to(device) for k in f.keys()}
    except Exception as e:  # safetensors raises several types for a damaged file
        raise ReproError(f"repro {p}: expected a safetensors file, found an unreadable one ({e})") from None
    if HEADER_KEY not in meta:
        raise ReproError(f"repro {p}: expected header key {HEADER_KEY!r}, found keys {sorted(meta)}")
    try:
        header = json.loads(meta[HEADER_KEY])
    except json.JSONDecodeError as e:
        raise ReproError(f"repro {p}: header {HEADER_KEY!r}: expected JSON, found a syntax error ({e})") from None
    if header.get("format") != FORMAT or header.get("format_version") != FORMAT_VERSION:
        raise ReproError(f"repro {p}: expected format {FORMAT!r} version {FORMAT_VERSION}, found "
                         f"{header.get('format')!r} version {header.get('format_version')!r}")
    kind = header.get("op")
    if kind not in _OPERANDS:
        raise ReproError(f"repro {p}: op: expected one of {sorted(_OPERANDS)}, found {kind!r}")
    try:
        request, output = _rebuild(kind, tensors, header["scalars"])
    except (KeyError, TypeError) as e:
        raise ReproError(f"repro {p}: {kind} call: missing or malformed entry {e}") from None
    try:
        request.validate()
    except KernelContractError as e:
        raise ReproError(f"repro {p}: the stored {kind} request breaks the kernel contract: {e}") from None
    return header, KernelCall(header["module"], header["component"], kind, request, output, header["backend"])


def _operand(tensors: dict[str, torch.Tensor], scalars: dict[str, Any], prefix: str) -> FP4Operand:
    key = prefix.split(".")[-1]
    return FP4Operand(tensors[f"{prefix}.packed"], tensors[f"{prefix}.scales"], tensors[f"{prefix}.global_scale"],
                      k=int(scalars[f"{key}.k"]), scale_layout=scalars[f"{key}.scale_layout"])


def _rebuild(kind: str, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> tuple[Any, Any]:
    if kind == "quantize_activation":
        req = ActQuantRequest(tensors["request.x"], tensors.get("request.global_scale"),
                              rms_weight=tensors.get("request.rms_weight"), rms_eps=float(scalars["rms_eps"]),
                              scale_layout=scalars["scale_layout"], recipe=scalars["recipe"])
        out = _operand(tensors, scalars, "output") if "output.packed" in tensors else None
        return req, out
    a, b = _operand(tensors, scalars, "request.a"), _operand(tensors, scalars, "request.b")
    if kind == "gemm":
        req = GemmRequest(a, b, scalars["swiglu_limit"])
    else:
        req = GroupedGemmRequest(a, b, tensors["request.offsets"], tensors["request.alphas"], scalars["swiglu_limit"])
    return req, tensors.get("output")


def replay(call: KernelCall, backend: Any) -> CallCheck:
    """Run the call's request through ``backend`` and judge the fresh output against the oracle."""
    method = {"gemm": backend.gemm, "grouped_gemm": backend.grouped_gemm,
              "quantize_activation": backend.quantize_activation}[call.op]
    return audit_request(call.op, call.request, method(call.request))
