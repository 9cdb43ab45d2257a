"""The sm_100a grouped (MoE) decode GEMM: ``sm100.token_tiles`` (slot schedule and token gather, pure
torch), ``token_gather_kernel`` + ``grouped_decode_kernel`` (CuTe DSL) and ``grouped_decode_launch``.

Three tiers, as test_sm100_decode_gemm.py:

* CPU, host side: the slot schedule and the token gather against plain loops (and mutants of their
  outputs that the checks must reject), the gathered scales read through the GEMM kernel's own
  scale-factor view, a CPU model of the two launches judged against the oracle per expert (experts
  with 0, 1 and several rows, SwiGLU), the launch plan, validation, and the backend's route (off by
  default, on when ``decode_route.GROUPED_DECODE_ROUTE`` is set).
* CPU, compile-only: both kernels compiled for sm_100a; the PTX census holds the design.
* B200 only (``gpu`` + ``sm100`` + ``parity``; conftest skips them elsewhere): the kernels against the
  oracle, the gather kernel against ``token_tiles`` bit for bit, determinism, and CUDA-graph replay
  with the routing changed in place.
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
from dsv4.kernels.cutedsl.sm100.decode_launch import DecodeConfig, decode_stages
from dsv4.kernels.cutedsl.sm100.grouped_decode_launch import (GroupedDecodeGemm100, grouped_decode_plan,
                                                              token_tile)
from dsv4.kernels.cutedsl.sm100.layout import TILE_K, TILE_M, unswizzle_32_4_4
from dsv4.kernels.cutedsl.sm100.token_tiles import (gather_token_tiles, slot_count, slot_scale_bytes,
                                                    slot_schedule)

sys.path.insert(0, str(Path(__file__).parent))  # the sm100 tests' operands, oracle and bound
from test_cutedsl_sm100 import _operand, _reference, assert_experts_within_bound, assert_within_bound  # noqa: E402
from sm100_grouped_decode_model import (check_gather, check_schedule, grouped_decode_model,  # noqa: E402
                                        linear_scales, random_offsets, schedule_loop, swizzled_token_scales)

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
B200_SMS = 148

# routings (offsets) with empty experts first / mid / last, single rows, and experts past one token tile
ROUTINGS = [[0, 1], [0, 0, 1, 1, 4, 4, 4, 5, 5], [0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 0, 0, 8],
            [0, 9, 9, 10, 12], [0, 0, 17, 17, 20, 20], [0, 0, 0]]


def _offs(offsets: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(offsets, dtype=torch.int32, device=device)


# ---- the slot schedule ------------------------------------------------------------------------------
@pytest.mark.parametrize("offsets", ROUTINGS)
@pytest.mark.parametrize("ntok", [8, 16])
def test_slot_schedule_matches_the_loop(offsets, ntok):
    rows, e = offsets[-1], len(offsets) - 1
    slots = slot_count(rows, e, ntok)
    sched = slot_schedule(_offs(offsets), ntok, slots)
    assert sched.dtype == torch.int32 and sched.shape == (slots, 4)
    assert sched.tolist() == schedule_loop(offsets, ntok, slots)
    check_schedule(sched, offsets, ntok)


@pytest.mark.parametrize("experts,ntok", [(8, 8), (64, 8), (256, 16), (384, 8)])
def test_slot_count_bounds_random_and_adversarial_routings(experts, ntok):
    gen = torch.Generator().manual_seed(experts + ntok)
    cases = [random_offsets(gen, experts, int(r)) for r in torch.randint(1, 3 * experts, (40,), generator=gen)]
    cases += [list(range(m + 1)) + [m] * (experts - m) for m in (1, ntok - 1, min(experts, 3 * ntok))]  # 1 row each
    cases += [[0] * experts + [experts * ntok + 1]]  # one expert with everything
    for offsets in cases:
        rows = offsets[-1]
        slots = slot_count(rows, experts, ntok)
        sched = slot_schedule(_offs(offsets), ntok, slots)
        assert sched.tolist() == schedule_loop(offsets, ntok, slots)
        check_schedule(sched, offsets, ntok)
    # tight: fewer than ntok rows, one per expert, fill every slot (a bound one lower would not do)
    m = min(ntok - 1, experts)
    sched = slot_schedule(_offs(list(range(m + 1)) + [m] * (experts - m)), ntok, slot_count(m, experts, ntok))
    assert all(lo < hi for _, lo, hi, _ in sched.tolist())


@pytest.mark.parametrize("field,delta", [(1, 1), (1, -1), (2, 1), (2, -1), (0, 1)])
def test_schedule_checks_reject_off_by_one_mutants(field, delta):
    """An off-by-one in a slot's row range or expert (what a wrong offset index would produce) fails
    both the loop comparison and the property check."""
    offsets, ntok = [0, 0, 3, 4, 13, 13], 8
    good = slot_schedule(_offs(offsets), ntok, slot_count(13, 5, ntok))
    mutant = good.clone()
    mutant[1, field] += delta  # slot 1: expert 3, rows 3:4
    assert mutant.tolist() != schedule_loop(offsets, ntok, good.shape[0])
    with pytest.raises(AssertionError):
        check_schedule(mutant, offsets, ntok)


def test_slot_schedule_reads_the_offsets_it_is_given():
    """Shifted offsets (an off-by-one of the caller) give a schedule the checks reject."""
    offsets, ntok = [0, 2, 2, 7], 8
    shifted = slot_schedule(_offs([0, 3, 3, 7]), ntok, slot_count(7, 3, ntok))
    with pytest.raises(AssertionError):
        check_schedule(shifted, offsets, ntok)


# ---- the token gather -------------------------------------------------------------------------------
def _gathered(offsets, k, ntok, layout="linear", seed=1):
    a = _operand(offsets[-1], k, seed, layout=layout)
    xsf = a.scales if layout == "swizzled" else swizzled_token_scales(a)
    sched = slot_schedule(_offs(offsets), ntok, slot_count(offsets[-1], len(offsets) - 1, ntok))
    return a, sched, *gather_token_tiles(a.packed, xsf, sched, ntok, k)


@needs_cutlass
@pytest.mark.parametrize("offsets", ROUTINGS[:6])
@pytest.mark.parametrize("ntok,k,layout", [(8, 64, "linear"), (16, 96, "swizzled"), (8, 544, "swizzled")])
def test_gather_puts_each_slots_tokens_where_the_kernel_reads_them(offsets, ntok, k, layout):
    a, sched, tiles, scales = _gathered(offsets, k, ntok, layout)
    check_gather(a, sched, tiles, scales, ntok)


@needs_cutlass
@pytest.mark.parametrize("field,delta", [(1, 1), (2, -1)])
def test_gather_checks_reject_a_gather_off_by_one_row(field, delta):
    offsets, ntok, k = [0, 2, 2, 7], 8, 64
    a, sched, _, _ = _gathered(offsets, k, ntok)
    bad = sched.clone()
    bad[0, field] += delta
    tiles, scales = gather_token_tiles(a.packed, swizzled_token_scales(a), bad, ntok, k)
    with pytest.raises(AssertionError):
        check_gather(a, sched, tiles, scales, ntok)


# ---- a CPU model of the two launches -------------------------------------------------------------------
@needs_cutlass
@pytest.mark.parametrize("offsets", [[0, 0, 1, 1, 4, 4, 4, 5, 5], [0, 9, 9, 10, 12], [0, 0, 0, 0, 3]])
@pytest.mark.parametrize("n,swiglu", [(160, None), (2 * 96, 2.5), (2 * 128, 2.5)])
def test_model_of_the_grouped_decode_launch_matches_the_oracle(offsets, n, swiglu):
    e, k = len(offsets) - 1, 96
    a = _operand(offsets[-1], k, 31, spread=20.0)
    b = _operand(e * n, k, 32, layout="swizzled", groups=e)
    req = GroupedGemmRequest(a, b, _offs(offsets), (a.global_scale * b.global_scale).float(), swiglu_limit=swiglu)
    y = grouped_decode_model(req)
    assert y.shape == req.out_shape
    assert_experts_within_bound(y, a, b, offsets, swiglu, f"grouped decode model n={n} swiglu={swiglu}")
    a_sw = _operand(offsets[-1], k, 31, spread=20.0, layout="swizzled")  # token scales as given swizzled
    req_sw = GroupedGemmRequest(a_sw, b, req.offsets, req.alphas, swiglu_limit=swiglu)
    assert torch.equal(grouped_decode_model(req_sw), y)


# ---- plan, validation, route -------------------------------------------------------------------------
@pytest.mark.parametrize("tokens,experts,topk,n,k,swiglu", [
    (1, 256, 6, 2 * 2048, 4096, True), (1, 256, 6, 4096, 2048, False),     # Flash w13 / w2
    (16, 256, 6, 2 * 2048, 4096, True), (16, 384, 6, 7168, 3072, False),   # Flash w13, Pro w2 at 16 tokens
    (4, 384, 6, 2 * 3072, 7168, True)])                                    # Pro w13
def test_plan_on_routed_expert_shapes(tokens, experts, topk, n, k, swiglu):
    rows = tokens * topk
    p = grouped_decode_plan(rows, experts, n, k, swiglu=swiglu, num_sms=B200_SMS)
    assert p.cfg.ntok == 8 and p.cfg.swiglu == swiglu  # sparse routing: the smallest MMA N
    assert p.slots == slot_count(rows, experts, 8) == rows // 8 + rows
    assert p.tiles == -(-(n // 2 if swiglu else n) // TILE_M) and p.k_tiles == -(-k // TILE_K)
    per = -(-p.k_tiles // p.splits)
    assert all(min(p.k_tiles, (z + 1) * per) > z * per for z in range(p.splits)), "an empty split"
    assert p.ctas >= 0.9 * min(B200_SMS, p.tiles * p.slots * min(p.k_tiles, 16)), p
    assert p.workspace_floats == (p.ctas * p.cfg.num_a * TILE_M * 8 if p.splits > 1 else 0)


def test_token_tile_and_plan_limits():
    assert token_tile(6, 256) == 8 and token_tile(96, 12) == 8 and token_tile(97, 12) == 16
    assert grouped_decode_plan(40, 2, 256, 256, swiglu=False, num_sms=B200_SMS).cfg.ntok == 16
    with pytest.raises(ValueError, match="rows >= 1"):
        grouped_decode_plan(0, 8, 256, 256, swiglu=False, num_sms=B200_SMS)


def _req(offsets, n=256, k=256, seed=3, device="cpu", **kw):
    e = len(offsets) - 1
    a = _operand(offsets[-1], k, seed, device=device)
    b = _operand(e * n, k, seed + 1, layout="swizzled", groups=e, device=device)
    return GroupedGemmRequest(a, b, _offs(offsets, device), (a.global_scale * b.global_scale).float(), **kw)


def test_supports_and_validation_name_expected_and_found():
    req = _req([0, 1, 1, 3])
    assert GroupedDecodeGemm100.supports(req)
    assert not GroupedDecodeGemm100.supports(GemmRequest(req.a, _operand(256, 256, 9)))
    assert not GroupedDecodeGemm100.supports(_req([0, 40, 40], k=256))  # 40 rows over 2 experts: > 16 a group
    k48 = _req([0, 1, 3], k=48)
    assert not GroupedDecodeGemm100.supports(k48)
    with pytest.raises(KernelContractError, match="K: expected a multiple of 32"):
        GroupedDecodeGemm100("cpu").prepare(k48)
    base = torch.zeros(req.b.packed.numel() + 8, dtype=torch.uint8)
    odd = FP4Operand(base[8:].view(req.b.packed.shape), req.b.scales, req.b.global_scale, k=256,
                     scale_layout="swizzled")
    bad = GroupedGemmRequest(req.a, odd, req.offsets, req.alphas)
    assert not GroupedDecodeGemm100.supports(bad)
    with pytest.raises(KernelContractError, match="b data_ptr: expected 16-byte aligned"):
        GroupedDecodeGemm100("cpu").prepare(bad)
    with pytest.raises(KernelContractError, match="request: expected a GroupedGemmRequest"):
        GroupedDecodeGemm100("cpu").prepare(GemmRequest(req.a, _operand(256, 256, 9)))
    with pytest.raises(KernelContractError, match="offsets: expected non-decreasing"):
        GroupedDecodeGemm100("cpu")(GroupedGemmRequest(req.a, req.b, _offs([0, 2, 1, 3]), req.alphas))
    with pytest.raises(KernelContractError, match="operands device: expected a CUDA tensor"):
        GroupedDecodeGemm100("cpu")(req)


def test_route_is_off_by_default_and_on_when_opted_in(monkeypatch):
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend, decode_route
    from dsv4.kernels.cutedsl.sm100.decode_route import use_grouped_decode_kernel

    sparse, dense = _req([0, 1, 1, 3]), _req([0, 4, 8])
    be = Sm100Backend("cpu")
    assert decode_route.GROUPED_DECODE_ROUTE is False
    assert not use_grouped_decode_kernel(3, 3, 256)
    assert be.route_grouped(sparse) == "generic kernel"
    monkeypatch.setattr(decode_route, "GROUPED_DECODE_ROUTE", True)
    assert use_grouped_decode_kernel(3, 3, 256) and use_grouped_decode_kernel(1, 256, 4096)
    assert not use_grouped_decode_kernel(4, 3, 256) and not use_grouped_decode_kernel(0, 3, 256)
    assert not use_grouped_decode_kernel(2, 3, 48)
    assert be.route_grouped(sparse) == "grouped decode kernel"
    assert be.route_grouped(dense) == "generic kernel"  # 8 rows over 2 experts: not decode routing
    assert Sm100Backend("cpu", routes=False).route_grouped(sparse) == "generic kernel"


def test_backend_grouped_gemm_takes_the_route_it_names(monkeypatch):
    """Off: the generic path (it refuses CPU tensors itself); on: ``GroupedDecodeGemm100`` gets the call."""
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend, decode_route

    calls = []
    monkeypatch.setattr(GroupedDecodeGemm100, "__call__", lambda self, req, **kw: calls.append(kw) or "decoded")
    req = _req([0, 1, 1, 3])
    with pytest.raises(KernelContractError, match="operands device: expected a CUDA tensor"):
        Sm100Backend("cpu").grouped_gemm(req)
    assert calls == []
    monkeypatch.setattr(decode_route, "GROUPED_DECODE_ROUTE", True)
    assert Sm100Backend("cpu").grouped_gemm(req, check_values=False) == "decoded"
    assert calls == [{"check_values": False}]


# ---- compile-only: the PTX census -------------------------------------------------------------------
SHAPE_CLASSES = [DecodeConfig(8, False, decode_stages(8, False)), DecodeConfig(8, True, decode_stages(8, True)),
                 DecodeConfig(16, False, decode_stages(16, False))]
_COMPILE: dict[str, float] = {}


@pytest.fixture(scope="module")
def builds():
    from dsv4.kernels.cutedsl.sm100.grouped_decode_launch import compile_grouped_decode_gemm, compile_token_gather

    t0 = time.process_time()
    gemm = {cfg: compile_grouped_decode_gemm(cfg, "sm_100a", keep_ptx=True)[1:] for cfg in SHAPE_CLASSES}
    gather = {nt: compile_token_gather(nt, "sm_100a", keep_ptx=True)[1:] for nt in (8, 16)}
    _COMPILE["cpu_seconds"] = time.process_time() - t0
    return gemm, gather


def _n(p: str, ptx: str) -> int:
    return len(re.findall(p, ptx))


def test_the_flash_and_pro_expert_plans_use_the_compiled_shape_classes():
    for n, k, sw in [(2 * 2048, 4096, True), (4096, 2048, False), (2 * 3072, 7168, True), (7168, 3072, False)]:
        for tokens in (1, 16):
            assert grouped_decode_plan(6 * tokens, 256, n, k, swiglu=sw, num_sms=B200_SMS).cfg in SHAPE_CLASSES


@needs_cutlass
@pytest.mark.parametrize("cfg", SHAPE_CLASSES, ids=lambda c: c.tag)
def test_grouped_decode_gemm_ptx_census(builds, cfg):
    ptx = builds[0][cfg][0]
    assert ".target sm_100a" in ptx
    mma = r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale(\.block16|\.scale_vec::4X)"
    assert _n(mma, ptx) == 4 * cfg.num_a == _n(r"tcgen05\.mma", ptx)
    assert not re.search(r"wgmma|kind::f16|kind::tf32|kind::f8f6f4|kind::mxf8f6f4|kind::mxf4\.|scale_vec::[12]X|\.block32", ptx)
    assert _n(r"tcgen05\.alloc\.cta_group::1", ptx) == 1 and _n(r"tcgen05\.dealloc\.cta_group::1", ptx) == 1
    assert _n(r"tcgen05\.cp\.cta_group::1\.32x128b\.warpx4", ptx) == 4 * (cfg.num_a + 1)
    assert _n(rf"tcgen05\.ld\.sync\.aligned\.32x32b\.x{cfg.ntok}\.b32", ptx) == cfg.num_a == _n(r"tcgen05\.ld\.", ptx)
    assert re.search(r"tcgen05\.wait::ld", ptx) and re.search(r"tcgen05\.commit\.cta_group::1", ptx)
    assert _n(r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes", ptx) \
        == 2 * cfg.num_a + 2
    assert _n(r"mbarrier\.init\.shared", ptx) == 2 * cfg.stages + 2
    assert re.search(r"atom\.global\.acq_rel\.add", ptx) and re.search(r"atom\.global\.exch", ptx)
    assert _n(r"ld\.global\.cg\.(b32|f32)", ptx) == cfg.num_a * cfg.ntok
    assert _n(r"cvt\.rn\.bf16\.f32", ptx) == cfg.ntok
    assert not re.search(r"\b(ld|st)\.local\b", ptx)
    assert re.search(r"ex2\.approx", ptx) if cfg.swiglu else not re.search(r"ex2\.", ptx)
    # grouped: the slot (ctaid.z) reads its schedule row and an empty slot branches away before any
    # barrier is initialised or TMEM allocated
    prologue = ptx[:ptx.index("mbarrier.init")]
    assert "tcgen05.alloc" not in prologue and "%ctaid.z" in prologue
    assert re.search(r"%ctaid\.z.*ld\.global\.(v4\.)?b32.*setp\.le\.s32[^\n]*\n\s*@%p\d+ bra", prologue, re.S), \
        "the empty slot's early exit"


@needs_cutlass
@pytest.mark.parametrize("ntok", [8, 16])
def test_token_gather_ptx_census(builds, ntok):
    ptx = builds[1][ntok][0]
    assert ".target sm_100a" in ptx
    assert _n(r"shfl\.sync\.up", ptx) == 5  # the warp scan of the per-expert tile counts
    assert _n(r"ld\.global\.nc\.v4\.b32", ptx) == 1 and _n(r"ld\.global\.nc\.b32", ptx) == 1  # rows, scale words
    assert _n(r"st\.global\.v4\.b32", ptx) == 2 and _n(r"st\.global\.b32", ptx) == 1  # sched row, rows, scales
    assert not re.search(r"tcgen05|wgmma|\b(ld|st)\.local\b", ptx)


@needs_cutlass
def test_compile_budget(builds):
    secs = [s for d in builds for _, s in d.values()]
    assert len(secs) == len(SHAPE_CLASSES) + 2
    assert _COMPILE["cpu_seconds"] < 30, f"compile budget for CI: {_COMPILE['cpu_seconds']:.1f} CPU s"


@needs_cutlass
def test_the_grouped_decode_kernel_does_not_compile_for_hopper():
    from dsv4.kernels.cutedsl.sm100.grouped_decode_launch import compile_grouped_decode_gemm

    with pytest.raises(Exception, match="arch"):
        compile_grouped_decode_gemm(SHAPE_CLASSES[0], "sm_90a")


# ---- B200 only ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gdg():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    return GroupedDecodeGemm100("cuda")


B200_ROUTINGS = [[0, 0, 1, 1, 4, 4, 4, 5, 5], [0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 0, 0, 0, 0, 8],
                 [0, 0, 9, 9, 10, 12, 12, 12, 12], [0] * 8 + [1]]


def _cuda_req(offsets, n, k, seed, swiglu=None, a_layout="linear"):
    e = len(offsets) - 1
    a = _operand(offsets[-1], k, seed, spread=30.0, layout=a_layout, device="cuda")
    b = _operand(e * n, k, seed + 1, layout="swizzled", groups=e, device="cuda")
    return GroupedGemmRequest(a, b, _offs(offsets, "cuda"), (a.global_scale * b.global_scale).float(),
                              swiglu_limit=swiglu)


@pytest.mark.parametrize("offsets", B200_ROUTINGS)
@pytest.mark.parametrize("n,k,swiglu", [(4096, 2048, None), (2 * 2048, 4096, 10.0), (200, 96, None),
                                        (2 * 96, 544, 10.0)])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_grouped_decode_matches_the_oracle(gdg, offsets, n, k, swiglu):
    """Experts with 0, 1 and several rows (one past a token tile); Flash w2 / w13 per-expert shapes and
    ragged ones (N, K not multiples of the tiles)."""
    req = _cuda_req(offsets, n, k, 100 + n + k, swiglu)
    y = gdg(req)
    assert y.shape == req.out_shape and y.dtype == torch.bfloat16
    assert_experts_within_bound(y, req.a, req.b, offsets, swiglu, f"B200 grouped decode {n}x{k} swiglu={swiglu}")
    generic = _generic(req)  # the generic sm100 grouped kernel: another summation order, same bound
    for ex in range(len(offsets) - 1):
        lo, hi = offsets[ex], offsets[ex + 1]
        if lo < hi:
            _, sabs, _ = _expert_reference(req, ex, lo, hi, swiglu)
            assert_within_bound(y[lo:hi], generic[lo:hi].double(), 2 * sabs, f"vs generic, expert {ex}", ulps=2)


def _generic(req):
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend

    return Sm100Backend("cuda").grouped_gemm(req)


def _expert_reference(req, ex, lo, hi, swiglu):
    e, n = req.num_experts, req.n_per_expert
    b = req.b
    per = b.scales.numel() // e
    b_lin = unswizzle_32_4_4(b.scales[ex * per:(ex + 1) * per], n, b.k // 16)
    a_e = FP4Operand(req.a.packed[lo:hi], linear_scales(req.a)[lo:hi], req.a.global_scale, k=req.a.k)
    return _reference(a_e, b.packed[ex * n:(ex + 1) * n], b_lin, b.global_scale[ex], swiglu)


class GpuGather:
    """The gather kernel compiled for this GPU (it is plain SIMT: sm_90 runs it as well as sm_100) and
    launched into poisoned buffers, so every byte it leaves must have been written."""

    def __init__(self, offsets, ntok, k, a: FP4Operand):
        from dsv4.kernels.cutedsl.common import gmem_ptr
        from dsv4.kernels.cutedsl.sm100.grouped_decode_launch import compile_token_gather, gather_arg_types

        pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
        cap = torch.cuda.get_device_capability()
        if cap[0] not in (9, 10):
            pytest.skip(f"needs an sm_90 or sm_100 GPU; found {cap}")
        self.a, self.ntok, self.k, self.e = a, ntok, k, len(offsets) - 1
        self.offs, self.xsf = _offs(offsets, "cuda"), swizzled_token_scales(a)
        self.slots = slot_count(a.rows, self.e, ntok)
        self.tiles = torch.full((self.slots * ntok, k // 2), 0xAB, dtype=torch.uint8, device="cuda")
        self.scales = torch.full((self.slots * slot_scale_bytes(k),), 0xCD, dtype=torch.uint8, device="cuda")
        self.sched = torch.full((self.slots, 4), -7, dtype=torch.int32, device="cuda")
        tensors = (self.offs, a.packed, self.xsf, self.tiles, self.scales, self.sched)
        self.ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip(tensors, gather_arg_types())]
        self.exe = compile_token_gather(ntok, f"sm_{cap[0]}{cap[1]}a")

    def launch(self) -> None:
        from dsv4.kernels.cutedsl.common import cu_stream

        self.exe(*self.ptrs, self.e, self.k, self.slots, cu_stream(self.a.device))

    def check(self) -> None:
        """The outputs are ``token_tiles``' for the current offsets, bit for bit."""
        torch.cuda.synchronize()
        want = slot_schedule(self.offs, self.ntok, self.slots)
        assert torch.equal(self.sched, want)
        tiles, scales = gather_token_tiles(self.a.packed, self.xsf, want, self.ntok, self.k)
        assert torch.equal(self.tiles, tiles) and torch.equal(self.scales, scales.view(torch.uint8))


@pytest.mark.parametrize("offsets", B200_ROUTINGS[:3] + [[0, 0, 17, 17, 20, 20], [0] * 300 + [40],
                                     random_offsets(torch.Generator().manual_seed(5), 384, 96)])
@pytest.mark.parametrize("ntok,layout", [(8, "linear"), (16, "swizzled")])
@pytest.mark.gpu
@pytest.mark.parity
def test_gpu_gather_kernel_is_token_tiles_bit_for_bit(offsets, ntok, layout):
    gather = GpuGather(offsets, ntok, 544, _operand(offsets[-1], 544, 7, layout=layout, device="cuda"))
    gather.launch()
    gather.check()


@pytest.mark.gpu
@pytest.mark.parity
def test_gpu_gather_kernel_in_a_cuda_graph_follows_the_routing():
    """Captured once, replayed after the offsets changed in place: the new routing's schedule and tiles
    (the gather reads nothing on the host)."""
    first, second = [0, 1, 1, 3, 4, 6, 6, 6, 6], [0, 0, 0, 4, 4, 5, 5, 6, 6]
    gather = GpuGather(first, 8, 2048, _operand(6, 2048, 9, layout="swizzled", device="cuda"))
    gather.launch()  # the module loads on the first launch: not inside a capture
    torch.cuda.synchronize()
    gather.sched.fill_(-7)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gather.launch()
    for offsets in (first, second):
        gather.offs.copy_(_offs(offsets, "cuda"))
        g.replay()
        gather.check()


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_grouped_decode_is_deterministic_and_resets_its_counters(gdg):
    offsets = [0, 2, 2, 3, 6]
    req = _cuda_req(offsets, 3072, 7168, 501)
    assert gdg.plan(6, 4, 3072, 7168, False).splits > 1
    y0 = gdg(req)
    for _ in range(3):
        assert torch.equal(gdg(req), y0)  # fixed split order: the same bits every launch
    assert int(gdg._counters.abs().sum()) == 0
    one = GroupedDecodeGemm100("cuda", max_splits=1)(req)  # no workspace: another order, same bound
    assert_experts_within_bound(one, req.a, req.b, offsets, None, "B200 grouped decode, one split")


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_grouped_decode_in_a_cuda_graph_follows_the_routing(gdg):
    """Captured once, replayed after the offsets changed in place: the replay computes the new routing
    (nothing was read on the host at capture) and equals an eager call bit for bit."""
    first, second = [0, 1, 1, 3, 4, 6, 6, 6, 6], [0, 0, 0, 4, 4, 5, 5, 6, 6]
    req = _cuda_req(first, 2 * 2048, 4096, 601, swiglu=10.0)
    gdg(req)  # compile and size the counters outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gdg(req, check_values=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = gdg(req, check_values=False)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gdg(req))
    req.offsets.copy_(_offs(second, "cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gdg(req))
    assert_experts_within_bound(out, req.a, req.b, second, 10.0, "B200 grouped decode graph replay")


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_backend_takes_the_grouped_decode_kernel_when_opted_in(gdg, monkeypatch):
    from dsv4.kernels.cutedsl.sm100 import Sm100Backend, decode_route

    req = _cuda_req([0, 1, 1, 3, 4, 6, 6, 6, 6], 4096, 2048, 701, a_layout="swizzled")
    assert Sm100Backend("cuda").route_grouped(req) == "generic kernel"
    monkeypatch.setattr(decode_route, "GROUPED_DECODE_ROUTE", True)
    be = Sm100Backend("cuda")
    assert be.route_grouped(req) == "grouped decode kernel"
    assert torch.equal(be.grouped_gemm(req), gdg(req))
