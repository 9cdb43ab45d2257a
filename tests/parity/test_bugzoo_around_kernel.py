"""Kernel faults injected around a real kernel backend's calls (the example package here; cutedsl_sm90
on an H100, benchmarks/run_gpu_validation.sh): the kernel runs unchanged, the fault alters its operands
or its output, and the audit catches and localizes it; the clean row on the same kernel stays quiet."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from dsv4.kernels.registry import get_backend
from parity.bugzoo.around import Around, FaultAround
from parity.bugzoo.backends import is_real_kernel, swap_backend
from parity.bugzoo.kernel_faults import SCALE_NEIGHBOUR

pytest.importorskip("tiled_gemm_backend")


def test_a_fault_wraps_the_real_kernel_a_stand_in_replaces_emulated() -> None:
    import dsv4

    model = dsv4.load_model("tiny", plan="default", backend="tiled_gemm", device="cpu")
    assert is_real_kernel(next(iter(model.dispatchers.values())).backend)
    with swap_backend(model, SCALE_NEIGHBOUR):
        b = next(iter(model.dispatchers.values())).backend
        assert isinstance(b, FaultAround) and b.name == "tiled_gemm" and b.inner.name == "tiled_gemm"
    assert not isinstance(next(iter(model.dispatchers.values())).backend, FaultAround)   # restored
    emu = dsv4.load_model("tiny", plan="default", backend="emulated", device="cpu")
    with swap_backend(emu, SCALE_NEIGHBOUR):
        assert next(iter(emu.dispatchers.values())).backend.name == SCALE_NEIGHBOUR.name


def test_around_alters_what_the_kernel_is_given_not_the_request() -> None:
    from dsv4.kernels.contract import GemmRequest
    from dsv4.numerics import nvfp4_quantize
    from dsv4.kernels.contract import FP4Operand

    g = torch.Generator().manual_seed(0)
    ops = [FP4Operand(*nvfp4_quantize(torch.randn(r, 256, generator=g)), k=256) for r in (4, 8)]
    req = GemmRequest(ops[0], ops[1])
    inner = get_backend("tiled_gemm", "cpu")
    clean = inner.gemm(req)
    tail = FaultAround(inner, Around(a_code_tail=lambda k: 192)).gemm(req)
    a_cut = FP4Operand(ops[0].packed.clone(), ops[0].scales, ops[0].global_scale, k=256)
    a_cut.packed[:, 96:] = 0
    assert not torch.equal(tail, clean) and torch.equal(tail, inner.gemm(GemmRequest(a_cut, ops[1])))
    assert int(req.a.packed[:, 96:].count_nonzero()) > 0          # the model's request is untouched


@pytest.mark.slow   # ~25 s: two zoo rows and the clean row on the tiny model
def test_faults_around_the_example_kernel_are_caught_and_localized(tmp_path: Path) -> None:
    from parity.bugzoo.__main__ import main

    js = tmp_path / "zoo.json"
    buf = io.StringIO()
    rc = main(["--fault", "kernel_ktail_tile_dropped", "--fault", "kernel_alpha_of_next_expert",
                      "--backend", "tiled_gemm", "--json", str(js)], console=Console(file=buf, width=200))
    assert rc == 0, buf.getvalue()
    rows = json.loads(js.read_text())["rows"]
    assert [r["backend"] for r in rows] == ["tiled_gemm"] * 3
    assert all(r["passed"] for r in rows) and all(r["localized"] for r in rows if r["fault"])
