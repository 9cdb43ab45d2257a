"""The pre-flight (``python -m dsv4.kernels.compile_check``) covers the decode route's kernels too: the
sm_90a decode GEMM and the sm_100a dense and grouped decode GEMMs with the grouped form's token gather,
compiled on the CPU with their PTX census (a B200 or H100 user sees a broken decode kernel before a run)."""
from __future__ import annotations

import importlib.util
import re

import pytest

from dsv4.kernels.cutedsl.common import KernelBuild

needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")


@needs_cutlass
def test_sm90_decode_builds_cover_the_routes_shape_classes_and_hold_their_census():
    from dsv4.kernels.cutedsl.sm90.decode_compile import decode_builds

    builds = {b.name.split(".", 2)[2]: b for b in decode_builds()}
    assert {"dense_q8", "dense_q16", "dense_q8_swiglu", "grouped_q8", "grouped_q8_swiglu"} <= set(builds)
    for name, b in builds.items():
        assert b.ok, f"{name}: {b.problems()}"
        assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16", b.ptx)) >= 4
        assert ("ex2." in b.ptx) == ("swiglu" in name)


@needs_cutlass
def test_sm100_decode_builds_are_block_scaled_mmas_and_a_simt_gather():
    from dsv4.kernels.cutedsl.sm100.decode_compile import SHAPE_CLASSES, decode_builds

    builds = decode_builds()
    assert len(builds) == 2 * len(SHAPE_CLASSES) + 2
    for b in builds:
        assert b.ok and b.arch == "sm_100a", f"{b.name}: {b.problems()}"
        mmas = len(re.findall(r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale", b.ptx))
        assert (mmas > 0) == ("token_gather" not in b.name), b.name


@needs_cutlass
def test_the_preflight_lists_the_decode_kernels_and_fails_on_a_broken_one(monkeypatch, capsys):
    from dsv4.kernels import compile_check
    from dsv4.kernels.cutedsl import act_quant_host, sm90
    from dsv4.kernels.cutedsl.sm90 import decode_compile

    monkeypatch.setattr(sm90, "compile_for_check", lambda: [])            # the generic GEMMs: their own tests
    monkeypatch.setattr(act_quant_host, "act_quant_builds", lambda arch: [])
    assert compile_check.main(["--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "decode_gemm.dense_q8" in out and "decode_gemm.grouped_q8_swiglu" in out
    broken = KernelBuild("cutedsl_sm90.decode_gemm.broken", "sm_90a", "wgmma.mma_async ...", 0.1,
                         list(decode_compile.REQUIRED), list(decode_compile.FORBIDDEN))
    monkeypatch.setattr(decode_compile, "decode_builds", lambda: [broken])
    assert compile_check.main(["--arch", "sm_90a"]) == 1
    assert "1 failed" in capsys.readouterr().out
