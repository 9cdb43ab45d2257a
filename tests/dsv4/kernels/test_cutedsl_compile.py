"""CPU tier that proves the sm_90a kernels are real: each compiles with placeholder pointers and its
PTX holds what the design promises (FP16 WGMMA with FP32 accumulation, the prmt E2M1 decode, the
exact E4M3 conversion, no sm_100 FP4 instruction; IEEE division in the activation quantizer).

Also executes the E2M1 decode's PTX text with a tiny interpreter, so the bit logic of the inline
assembly the kernels run is checked here, not a Python copy of it.
"""
from __future__ import annotations

import importlib.util
import sys
import random
import re
import struct

from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))   # the PTX interpreter beside this file
from ptx_interp import E2M1, _run_ptx  # noqa: E402

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")



def _gemm_variant_names() -> list[str]:
    if not HAS_CUTLASS:
        return ["<cutlass missing>"]
    from dsv4.kernels.cutedsl.sm90.compile import gemm_variants

    return [name for name, _ in gemm_variants()]


@pytest.fixture(scope="module")
def sm90_builds():
    from dsv4.kernels.cutedsl.sm90 import compile_for_check

    return {b.name: b for b in compile_for_check()}


@needs_cutlass
@pytest.mark.parametrize("name", _gemm_variant_names())
def test_sm90_gemm_compiles_to_fp16_wgmma_without_fp4_instructions(sm90_builds, name):
    b = sm90_builds[name]
    assert b.error is None, b.error
    assert b.problems() == []
    census = b.census()
    assert census[r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16"] >= 4
    assert census[r"cvt\.[a-z0-9.]*e2m1x2"] == 0
    assert "tcgen05" not in b.ptx
    assert ".target sm_90a" in b.ptx


@needs_cutlass
def test_sm90_wgmma_n_matches_tile_width(sm90_builds):
    """The decode shape classes put the tokens on the WGMMA N side (n8 .. n64); prefill uses n128."""
    want = {"dense_decode_q8": 8, "dense_decode_q16": 16, "dense_decode_q32": 32, "dense_decode_q64": 64,
            "dense_prefill_128x128": 128, "grouped_decode_q8_swiglu": 8}
    for name, n in want.items():
        shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", sm90_builds[name].ptx))
        assert shapes == {str(n)}, (name, shapes)


@needs_cutlass
def test_sm90_block_scale_multiply_is_round_to_nearest_without_flush(sm90_builds):
    """The e2m1*e4m3 product must be an exact f16x2 multiply: .rn, and no .ftz (which would flush
    FP16 subnormals; none occur for NVFP4, but the instruction must not depend on that)."""
    ptx = sm90_builds["dense_decode_q8"].ptx
    muls = re.findall(r"mul(\.[a-z0-9]+)*\.f16x2", ptx)
    assert muls and all(".ftz" not in "".join(m) for m in muls)
    assert ptx.count("mul.rn.f16x2") >= 32


@needs_cutlass
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_act_quant_compiles_with_ieee_division_only(arch):
    from dsv4.kernels.cutedsl.act_quant_host import act_quant_builds

    builds = act_quant_builds(arch)
    assert len(builds) >= 5
    for b in builds:
        assert b.error is None, (b.name, b.error)
        assert b.problems() == [], (b.name, b.problems())
        assert not re.search(r"\.approx", b.ptx), b.name  # no approximate div/rcp/sqrt/ex2 at all
        assert f".target {arch}" in b.ptx
    exact = next(b for b in builds if b.name == "act_quant_exact_static_linear")
    # 16 element divisions + the block scale division, all IEEE round-to-nearest
    assert exact.ptx.count("div.rn.f32") >= 17
    rcp = next(b for b in builds if b.name == "act_quant_rcp_rms_runtime_swizzled")
    assert rcp.ptx.count("rcp.rn.f32") >= 2


@needs_cutlass
@pytest.mark.slow   # compiles every kernel (~7 s)
def test_compile_check_cli_exits_zero_and_prints_census(capsys):
    from dsv4.kernels import compile_check

    rc = compile_check.main(["--arch", "sm_90a", "--only", "dense_decode_q8", "act_quant_exact_static_linear"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "dense_decode_q8" in out and "wgmma" in out


@needs_cutlass
def test_compile_check_fails_on_forbidden_instruction():
    from dsv4.kernels.cutedsl.common import KernelBuild

    bad = KernelBuild("k", "sm_90a", "cvt.rn.f16x2.e2m1x2 %r1, %rs1;", 0.1, [r"wgmma"], [r"cvt\.[a-z0-9.]*e2m1x2"])
    assert set(bad.problems()) == {"missing required PTX /wgmma/", r"forbidden PTX /cvt\.[a-z0-9.]*e2m1x2/ present"}
    assert KernelBuild("k", "sm_90a", "", 0.0, error="boom").problems() == ["compile failed: boom"]


@needs_cutlass
def test_e2m1_decode_ptx_is_bit_exact_in_documented_order():
    """Every nibble pattern decodes to its E2M1 value times the scale (sign of -0 kept), in the
    documented element order (n0,n4 | n1,n5 | n2,n6 | n3,n7), for all 2^16 low halves + random words."""
    import numpy as np

    from dsv4.kernels.cutedsl.sm90 import ptx

    one = 0x3C003C00  # f16x2 (1.0, 1.0)
    quarter = 0x34003400  # (0.25, 0.25): also checks the scale multiply is applied exactly
    order = (0, 4, 1, 5, 2, 6, 3, 7)
    rng = random.Random(0)
    words = list(range(0, 1 << 16, 7)) + [(w << 16) | w for w in range(0, 1 << 16, 251)]
    words += [rng.getrandbits(32) for _ in range(3000)]
    for scale_word, scale in ((one, 1.0), (quarter, 0.25)):
        for x in words:
            out = _run_ptx(ptx._DECODE8, [x, scale_word], 4)
            vals = np.frombuffer(struct.pack("<4I", *out), dtype=np.float16)
            for v, i in zip(vals, order):
                nib = (x >> (4 * i)) & 0xF
                want = E2M1[nib & 7] * scale * (-1 if nib & 8 else 1)
                assert float(v) == want and bool(np.signbit(v)) == bool(nib & 8), (hex(x), i)


@needs_cutlass
def test_sm90_prefill_dequant_compiles_to_exact_conversions(sm90_builds):
    """The prefill route's FP4 -> BF16 kernel: 16 values per block through two exact f16x2 decodes
    (8 ``mul.rn.f16x2``), 8 ``cvt.rn.bf16x2.f32``, two 16-byte stores; swizzled scales need the row."""
    for name in ("dequant_bf16_linear", "dequant_bf16_swizzled"):
        b = sm90_builds[name]
        assert b.error is None and b.problems() == [], (name, b.problems())
        c = b.census()
        assert c[r"mul\.rn\.f16x2"] == 8 and c[r"cvt\.rn\.bf16x2\.f32"] == 8 and c[r"st\.global\.v4\.b32"] == 2
        assert ".target sm_90a" in b.ptx
    assert "div" not in sm90_builds["dequant_bf16_linear"].ptx
    assert re.search(r"div\.[su]32", sm90_builds["dequant_bf16_swizzled"].ptx)


@needs_cutlass
def test_sm90_prefill_epilogue_compiles_with_the_generic_kernels_swiglu(sm90_builds):
    """The prefill route's epilogue: 4 outputs per iteration (16-byte FP32 loads, two bf16x2 converts,
    one 8-byte store); the SwiGLU form reads gate and up and takes 4 exponentials and 4 IEEE
    reciprocals, as the generic kernel's ``_store`` does."""
    plain, sw = sm90_builds["prefill_epilogue"], sm90_builds["prefill_epilogue_swiglu"]
    for b in (plain, sw):
        assert b.error is None and b.problems() == [], (b.name, b.problems())
        assert b.ptx.count("cvt.rn.bf16x2.f32") == 2 and ".target sm_90a" in b.ptx
    assert plain.ptx.count("ld.global.nc.v4.f32") == 1 and "ex2" not in plain.ptx
    assert sw.ptx.count("ld.global.nc.v4.f32") == 2
    assert sw.ptx.count("ex2.approx") == 4 and sw.ptx.count("rcp.rn.f32") == 4
