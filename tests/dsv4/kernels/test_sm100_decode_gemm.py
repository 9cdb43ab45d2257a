"""The sm_100a decode GEMM (``dsv4.kernels.cutedsl.sm100.decode_kernel`` / ``decode_launch``): swap-AB
(weights on the 128-row MMA M side, 1..16 tokens on N = 8 or 16), split-K over grid.y with a
deterministic workspace reduction, fused SwiGLU.

Three tiers, as test_cutedsl_sm100.py:

* CPU, host side: the launch plan on the DeepSeek-V4 Pro/Flash decode shapes (every split owns a
  k-tile, the CTAs cover the SMs, SMEM fits), the SwiGLU weight view read through the kernel's own
  scale-factor view, validation before any launch.
* CPU, compile-only: every shape class compiled for sm_100a; the PTX census holds what the design
  promises (block-scaled tcgen05 MMAs, TMEM alloc/ld/cp, TMA, mbarrier ring, the split counter, no
  local memory).
* B200 only (``gpu`` + ``sm100`` + ``parity``; conftest skips them elsewhere): the kernel executed and
  judged like the generic sm100 kernel (float64 reference, spec §6 bound) and against the emulated
  backend, plus determinism and the self-resetting split counters. ``pytest -m "parity and sm100"``.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from dsv4.kernels.contract import FP4Operand, GemmRequest, GroupedGemmRequest, KernelContractError
from dsv4.kernels.cutedsl.sm100.decode_launch import (MAX_SPLITS, SMEM_PER_CTA_RESERVED, SMEM_PER_SM,
                                                      DecodeConfig, DecodeGemm100, ctas_per_sm, decode_plan,
                                                      decode_stages, weight_scales)
from dsv4.kernels.cutedsl.sm100.layout import TILE_K, TILE_M, unswizzle_32_4_4

sys.path.insert(0, str(Path(__file__).parent))  # the sm100 tests' operands, oracle and bound
from test_cutedsl_sm100 import _operand, _reference, assert_within_bound  # noqa: E402

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
B200_SMS = 148

# DeepSeek-V4 Pro/Flash decode GEMMs: (weight rows N, K, fused SwiGLU)
DSV4_SHAPES = [(3072, 7168, False), (7168, 3072, False), (1536, 7168, False), (6144, 7168, True),
               (129280, 7168, False), (4096, 4096, True)]
SHAPE_CLASSES = [DecodeConfig(nt, sw, decode_stages(nt, sw)) for nt in (8, 16) for sw in (False, True)]


# ---- plan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,k,swiglu", DSV4_SHAPES)
@pytest.mark.parametrize("m", [1, 4, 8, 9, 16])
def test_plan_splits_own_k_tiles_and_cover_the_sms(m, n, k, swiglu):
    p = decode_plan(m, n, k, swiglu=swiglu, num_sms=B200_SMS)
    assert p.cfg.ntok == (8 if m <= 8 else 16) and p.cfg.swiglu == swiglu
    n_out = n // 2 if swiglu else n
    assert p.tiles == -(-n_out // TILE_M) and p.k_tiles == -(-k // TILE_K)
    # the kernel's split ranges [z*per, min(k_tiles, (z+1)*per)) partition the k-tiles, none empty
    ranges = [(z * p.per_split, min(p.k_tiles, (z + 1) * p.per_split)) for z in range(p.splits)]
    assert all(hi > lo for lo, hi in ranges), ranges
    assert ranges[0][0] == 0 and ranges[-1][1] == p.k_tiles
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert 1 <= p.splits <= MAX_SPLITS
    assert p.ctas >= 0.9 * min(B200_SMS, p.tiles * min(p.k_tiles, MAX_SPLITS)), p
    assert p.workspace_floats == (p.ctas * p.cfg.num_a * TILE_M * p.cfg.ntok if p.splits > 1 else 0)


def test_plan_on_the_flagship_shapes():
    """Numbers worth knowing (and noticing when they change)."""
    got = {(n, k, sw): (p.tiles, p.splits, p.ctas) for n, k, sw in DSV4_SHAPES
           for p in [decode_plan(1, n, k, swiglu=sw, num_sms=B200_SMS)]}
    assert got[(129280, 7168, False)] == (1010, 1, 1010)  # lm_head: plenty of tiles, no split
    assert got[(3072, 7168, False)] == (24, 6, 144)
    assert got[(6144, 7168, True)] == (24, 6, 144)
    for (n, k, sw), (tiles, splits, ctas) in got.items():
        assert ctas >= 0.9 * B200_SMS or tiles >= B200_SMS, (n, k, sw, ctas)


def test_plan_small_problems_and_token_limits():
    p = decode_plan(3, 40, 96, swiglu=True, num_sms=B200_SMS)
    assert (p.tiles, p.splits, p.k_tiles) == (1, 1, 1)
    for m in (0, 17):
        with pytest.raises(ValueError, match="tokens"):
            decode_plan(m, 256, 256, swiglu=False, num_sms=B200_SMS)


@pytest.mark.parametrize("cfg", SHAPE_CLASSES, ids=lambda c: c.tag)
def test_shape_classes_fit_shared_memory(cfg):
    assert cfg.stages >= 4
    assert cfg.smem_bytes() <= 227 * 1024
    assert ctas_per_sm(cfg) * (cfg.smem_bytes() + SMEM_PER_CTA_RESERVED) <= SMEM_PER_SM
    # one stage: A + SFA per weight batch, B + a whole 128-row SFB atom
    assert cfg.stage_bytes == cfg.num_a * (128 * 128 + 128 * 16) + cfg.ntok * 128 + 128 * 16


# ---- host side: SwiGLU weight batches, validation -----------------------------------------------
@needs_cutlass
@pytest.mark.parametrize("half,layout", [(128, "swizzled"), (96, "swizzled"), (96, "linear")])
def test_swiglu_weight_batches_are_gate_then_up(half, layout):
    """The kernel's A view of ``[gate; up]`` (batches 0 / 1), read through its own scale-factor view,
    carries the gate rows' and the up rows' scales."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    k = 64
    a, b = _operand(2, k, 1), _operand(2 * half, k, 2, layout=layout)
    lin = b.scales if layout == "linear" else unswizzle_32_4_4(b.scales, 2 * half, k // 16)
    seen = kernel_scale_view(weight_scales(GemmRequest(a, b, swiglu_limit=5.0)), half, k, batches=2)
    assert torch.equal(seen[0], lin[:half].view(torch.uint8))
    assert torch.equal(seen[1], lin[half:].view(torch.uint8))


def test_validation_names_expected_and_found_before_any_launch():
    dg = DecodeGemm100("cpu")
    b = _operand(256, 256, 3)
    for m in (17, 64):
        req = GemmRequest(_operand(m, 256, 4), b)
        assert not DecodeGemm100.supports(req)
        with pytest.raises(KernelContractError, match=r"tokens.*expected 1\.\.16, found " + str(m)):
            dg(req)
    req48 = GemmRequest(_operand(2, 48, 5), _operand(256, 48, 6))
    assert not DecodeGemm100.supports(req48)
    with pytest.raises(KernelContractError, match="K: expected a multiple of 32"):
        dg(req48)
    # a packed operand 8 bytes off a 16-byte boundary: TMA needs 16-byte aligned bases
    base = torch.zeros(256 * 128 + 8, dtype=torch.uint8)
    odd = FP4Operand(base[8:].view(256, 128), b.scales, b.global_scale, k=256)
    req = GemmRequest(_operand(2, 256, 7), odd)
    assert not DecodeGemm100.supports(req)
    with pytest.raises(KernelContractError, match="16-byte aligned"):
        dg(req)
    with pytest.raises(KernelContractError, match="CUDA tensor"):  # valid, but on the CPU
        dg(GemmRequest(_operand(2, 256, 8), b))


def test_supports_only_dense_decode_requests():
    a, b = _operand(4, 256, 9), _operand(256, 256, 10)
    assert DecodeGemm100.supports(GemmRequest(a, b))
    assert DecodeGemm100.supports(GemmRequest(a, b, swiglu_limit=7.0))
    grouped = GroupedGemmRequest(a, _operand(512, 256, 11, groups=2), torch.tensor([0, 2, 4], dtype=torch.int32),
                                 torch.ones(2))
    assert not DecodeGemm100.supports(grouped)  # the grouped form is GroupedDecodeGemm100's


def test_backend_routes_dense_decode_requests_to_the_decode_kernel(monkeypatch):
    """``Sm100Backend.route``: dense 1..16-token requests on >= 2,048 weight rows go to the decode kernel,
    the rest (more tokens, narrow weights, unaligned data, routes off, the switch off) to the generic one."""
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend, decode_route

    be, plain = Sm100Backend("cpu"), Sm100Backend("cpu", routes=False)
    wide, narrow = _operand(2048, 256, 20), _operand(1024, 256, 21)
    assert be.route(GemmRequest(_operand(1, 256, 22), wide)) == "decode kernel"
    assert be.route(GemmRequest(_operand(16, 256, 23), wide, swiglu_limit=7.0)) == "decode kernel"
    assert be.route(GemmRequest(_operand(17, 256, 24), wide)) == "generic kernel"      # beyond 16 tokens
    assert be.route(GemmRequest(_operand(4, 256, 25), narrow)) == "generic kernel"     # under 2,048 rows
    assert plain.route(GemmRequest(_operand(1, 256, 26), wide)) == "generic kernel"
    base = torch.zeros(2048 * 128 + 8, dtype=torch.uint8)                            # 8 bytes off 16
    odd = FP4Operand(base[8:].view(2048, 128), wide.scales, wide.global_scale, k=256)
    assert be.route(GemmRequest(_operand(2, 256, 27), odd)) == "generic kernel"
    monkeypatch.setattr(decode_route, "DECODE_ROUTE", False)
    assert be.route(GemmRequest(_operand(1, 256, 28), wide)) == "generic kernel"


# ---- compile-only: the PTX census ---------------------------------------------------------------
_COMPILE_CPU_SECONDS: list[float] = []


@pytest.fixture(scope="module")
def builds():
    from dsv4.kernels.cutedsl.sm100.decode_launch import compile_decode_gemm

    t0 = time.process_time()
    out = {cfg: compile_decode_gemm(cfg, "sm_100a", keep_ptx=True)[1] for cfg in SHAPE_CLASSES}
    _COMPILE_CPU_SECONDS.append(time.process_time() - t0)
    return out


def _n(p: str, ptx: str) -> int:
    return len(re.findall(p, ptx))


@needs_cutlass
@pytest.mark.parametrize("cfg", SHAPE_CLASSES, ids=lambda c: c.tag)
def test_decode_kernel_ptx_census(builds, cfg):
    ptx = builds[cfg]
    assert ".target sm_100a" in ptx
    # the block-scaled NVFP4 MMA, 16-element scales: 4 MMAs (K 64 each) per k-tile and weight batch
    mma = r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale(\.block16|\.scale_vec::4X)"
    assert _n(mma, ptx) == 4 * cfg.num_a == _n(r"tcgen05\.mma", ptx)
    assert not re.search(r"wgmma|kind::f16|kind::tf32|kind::f8f6f4|kind::mxf8f6f4|kind::mxf4\.|scale_vec::[12]X|\.block32", ptx)
    # TMEM: allocated, freed, scales copied in (SFA per batch + SFB: 4 copies of 32 rows x 128 bits each)
    assert _n(r"tcgen05\.alloc\.cta_group::1", ptx) == 1 and _n(r"tcgen05\.dealloc\.cta_group::1", ptx) == 1
    assert _n(r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4", ptx) == 4 * (cfg.num_a + 1)
    # epilogue: one 32x32b.x{ntok} TMEM load per accumulator (thread t = weight row t), then waited on
    assert _n(rf"tcgen05\.ld\.sync\.aligned\.32x32b\.x{cfg.ntok}\.b32", ptx) == cfg.num_a
    assert _n(r"tcgen05\.ld\.", ptx) == cfg.num_a and re.search(r"tcgen05\.wait::ld", ptx)
    assert re.search(r"tcgen05\.commit\.cta_group::1", ptx)  # MMA completion -> stage / accumulator barriers
    # TMA ring: A + SFA per weight batch, B + SFB; 2 mbarriers per stage + the accumulator pair
    assert _n(r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx) \
        == 2 * cfg.num_a + 2
    assert _n(r"mbarrier\.init\.shared", ptx) == 2 * cfg.stages + 2
    assert re.search(r"mbarrier\.try_wait\.parity", ptx) and re.search(r"mbarrier\.arrive\.expect_tx", ptx)
    # split-K: counter (acq_rel add, reset by exchange), partials read back past L1, in split order
    assert re.search(r"atom\.global\.acq_rel\.add", ptx) and re.search(r"atom\.global\.exch", ptx)
    assert _n(r"fence\.acq_rel\.gpu", ptx) >= 2
    assert _n(r"ld\.global\.cg\.(b32|f32)", ptx) == cfg.num_a * cfg.ntok
    # BF16 out, nothing in local memory
    assert _n(r"cvt\.rn\.bf16\.f32", ptx) == cfg.ntok
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    if cfg.swiglu:  # sigmoid of the clamped gate, IEEE division
        assert re.search(r"ex2\.approx", ptx) and re.search(r"div\.rn\.f32", ptx)
    else:
        assert not re.search(r"ex2\.", ptx)


@needs_cutlass
def test_compile_budget(builds):
    assert len(builds) == len(SHAPE_CLASSES)
    assert _COMPILE_CPU_SECONDS[0] < 30, f"compile budget for CI: {_COMPILE_CPU_SECONDS[0]:.1f} CPU s"


@needs_cutlass
def test_the_token_tile_is_the_smallest_legal_mma_n():
    """CuTe DSL's MmaMXF4NVF4Op (the source the kernel cites) accepts N = 8 and 16 with M = 128 and
    cta_group::1, and rejects N = 4 and N = 12 (not a multiple of 8)."""
    from cutlass import Float8E4M3FN
    from cutlass.cute.nvgpu import tcgen05

    from dsv4.kernels.cutedsl.sm100.decode_kernel import Sm100DecodeGemm

    def op(nn):
        return tcgen05.MmaMXF4NVF4Op(Float8E4M3FN, (128, nn, 64), tcgen05.CtaGroup.ONE, tcgen05.OperandSource.SMEM)

    op(8), op(16)
    for bad in (4, 12):
        with pytest.raises(Exception, match="N-mode"):
            op(bad)
    with pytest.raises(ValueError, match="ntok"):
        Sm100DecodeGemm(4, False, 4)


@needs_cutlass
def test_the_decode_kernel_does_not_compile_for_hopper():
    from dsv4.kernels.cutedsl.sm100.decode_launch import compile_decode_gemm

    with pytest.raises(Exception, match="arch"):
        compile_decode_gemm(SHAPE_CLASSES[0], "sm_90a")


# ---- B200 only ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dg():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    return DecodeGemm100("cuda")


def _cuda(rows, k, seed, **kw) -> FP4Operand:
    return _operand(rows, k, seed, device="cuda", **kw)


def _judge(y, a, b, swiglu, what):
    """Spec §6 bound against the float64 oracle (as test_cutedsl_sm100), and the emulated backend
    (the contract's executable definition) within twice that bound."""
    from dsv4.kernels.emulated import EmulatedBackend

    n = b.rows
    b_lin = b.scales if b.scale_layout == "linear" else unswizzle_32_4_4(b.scales, n, b.k // 16)
    a_op = a if a.scale_layout == "linear" else FP4Operand(
        a.packed, unswizzle_32_4_4(a.scales, a.rows, a.k // 16), a.global_scale, k=a.k)
    ref, sabs, _ = _reference(a_op, b.packed, b_lin, b.global_scale, swiglu)
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert_within_bound(y, ref, sabs, what)
    emu = EmulatedBackend().gemm(GemmRequest(a, b, swiglu_limit=swiglu))
    assert_within_bound(y, emu.double(), 2 * sabs, f"{what} vs emulated", ulps=2)


@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(3072, 7168), (7168, 3072), (1536, 7168), (200, 96), (129280, 512)])
@pytest.mark.parametrize("layout", ["swizzled", "linear"])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_decode_dense_matches_reference(dg, m, n, k, layout):
    a, b = _cuda(m, k, 100 + m, layout=layout), _cuda(n, k, 200 + m, layout=layout)
    _judge(dg(GemmRequest(a, b)), a, b, None, f"B200 decode {m}x{n}x{k} {layout}")


@pytest.mark.parametrize("m,n,k", [(1, 6144, 7168), (16, 4096, 4096), (5, 2 * 96, 512)])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_decode_swiglu_beyond_the_limit(dg, m, n, k):
    limit = 10.0
    a, b = _cuda(m, k, 300 + m, spread=40.0, layout="swizzled"), _cuda(n, k, 400 + m, layout="swizzled")
    y = dg(GemmRequest(a, b, swiglu_limit=limit))
    _judge(y, a, b, limit, f"B200 decode SwiGLU {m}x{n}x{k}")


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_decode_is_deterministic_and_resets_its_counters(dg):
    a, b = _cuda(7, 7168, 501, layout="swizzled"), _cuda(3072, 7168, 502, layout="swizzled")
    req = GemmRequest(a, b)
    assert dg.plan(7, 3072, 7168, False).splits > 1
    y0 = dg(req)
    for _ in range(3):
        assert torch.equal(dg(req), y0)  # fixed split order: bit-identical every launch
    assert int(dg._counters.abs().sum()) == 0  # every tile counter back to zero
    # one split only (no workspace): the same numbers within the bound, a different summation order
    one = DecodeGemm100("cuda", max_splits=1)
    _judge(one(req), a, b, None, "B200 decode, one split")


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_decode_agrees_with_the_generic_sm100_kernel(dg):
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend

    a, b = _cuda(16, 2048, 601, layout="swizzled"), _cuda(1024, 2048, 602, layout="swizzled")
    y, g = dg(GemmRequest(a, b)), Sm100Backend("cuda").gemm(GemmRequest(a, b))
    b_lin = unswizzle_32_4_4(b.scales, 1024, 128)
    a_op = FP4Operand(a.packed, unswizzle_32_4_4(a.scales, 16, 128), a.global_scale, k=2048)
    _, sabs, _ = _reference(a_op, b.packed, b_lin, b.global_scale, None)
    assert_within_bound(y, g.double(), 2 * sabs, "decode vs generic sm100 kernel", ulps=2)


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_backend_gemm_takes_the_decode_kernel_at_decode_sizes(dg):
    """The backend's decode-size call is the decode kernel's, bit for bit; ``routes=False`` the generic
    kernel's, within the bound of each other (different summation orders)."""
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend

    a, b = _cuda(4, 7168, 701, layout="swizzled"), _cuda(3072, 7168, 702, layout="swizzled")
    req = GemmRequest(a, b)
    be = Sm100Backend("cuda")
    assert be.route(req) == "decode kernel"
    assert torch.equal(be.gemm(req), dg(req))
    _judge(Sm100Backend("cuda", routes=False).gemm(req), a, b, None, "B200 generic kernel at a decode size")

