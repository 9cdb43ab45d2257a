"""The sm_100a (B200) NVFP4 backend: ``dsv4.kernels.cutedsl.sm100``.

Three tiers (spec nvfp4-and-kernels.md §8):

* CPU, host side: scale swizzling against the oracle, the kernel's own scale-factor view executed on
  the CPU (host-only ``@cute.jit``), the SwiGLU view of B, the grouped tile schedule, launch-argument
  packing, validation errors, the compiled-kernel cache, and a torch model of what the kernel computes
  from the packed arguments, judged against ``nvfp4_gemm_reference``.
* CPU, compile-only: every configuration compiled for sm_100a; PTX must hold the block-scaled
  ``tcgen05.mma ... kind::mxf4nvf4`` with 16-element scales.
* B200 only (``gpu`` + ``sm100`` + ``parity``; conftest skips them elsewhere): the kernels executed
  and judged against the float64 reference (spec §6 bounds), and against ``torch._scaled_mm``.
"""
from __future__ import annotations

import importlib.util
import math
import time

import pytest
import torch
import torch.nn.functional as F

from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest, KernelContractError
from dsv4.kernels.cutedsl.sm100 import LaunchArgs, Sm100Backend
from dsv4.kernels.cutedsl.sm100.layout import (CONFIGS, TILE_M, KernelConfig, choose_config,
                                               grouped_schedule, launch_problems, swiglu_half_scales, swizzled_scales,
                                               unswizzle_32_4_4)
from dsv4.numerics import (e2m1_decode, e4m3_decode, nvfp4_gemm_reference, nvfp4_quantize, swizzle_scales,
                           unpack_nibbles)

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")


# ---- operands -----------------------------------------------------------------------------------
def _x(rows: int, k: int, seed: int, spread: float = 4.0, device: str = "cpu") -> torch.Tensor:
    """BF16 values whose 16-blocks span several binades, so block scales differ from block to block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * torch.exp2(torch.randint(-3, 4, (rows, k // 16), generator=g)
                                                        .repeat_interleave(16, 1).float()) * spread
    return x.to(torch.bfloat16).to(device)


def _operand(rows: int, k: int, seed: int, *, layout: str = "linear", groups: int | None = None,
             spread: float = 4.0, device: str = "cpu") -> FP4Operand:
    """NVFP4-quantize random rows; with ``groups``, that many stacked matrices quantized (and swizzled)
    independently, with global scales ``[groups]`` (a grouped GEMM's B)."""
    x = _x(rows, k, seed, spread, device)
    parts = [nvfp4_quantize(xe) for xe in (x.chunk(groups) if groups else [x])]
    packed = torch.cat([p for p, _, _ in parts])
    lin = torch.cat([s for _, s, _ in parts])
    g = torch.stack([gg for _, _, gg in parts]) if groups else parts[0][2]
    per = rows // (groups or 1)
    scales = lin if layout == "linear" else swizzle_scales(lin.view(groups or 1, per, k // 16)).reshape(-1)
    return FP4Operand(packed, scales.contiguous(), g.to(torch.float32), k=k, scale_layout=layout)


def _expert_operand(b: FP4Operand, e: int, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Expert ``e`` of a stacked operand: packed rows, linear scales, its global scale."""
    n, sc = b.rows // experts, b.k // 16
    packed = b.packed[e * n:(e + 1) * n]
    if b.scale_layout == "linear":
        scales = b.scales[e * n:(e + 1) * n]
    else:
        per = math.ceil(n / 128) * 128 * math.ceil(sc / 4) * 4
        scales = unswizzle_32_4_4(b.scales[e * per:(e + 1) * per], n, sc)
    return packed, scales, b.global_scale[e]


def _swiglu64(y: torch.Tensor, limit: float) -> torch.Tensor:
    n = y.shape[-1] // 2
    gate = y[..., :n].clamp(max=limit)
    return F.silu(gate) * y[..., n:].clamp(-limit, limit)


def _reference(a: FP4Operand, b_packed, b_scales, b_global, swiglu: float | None):
    """(float64 reference, the scale of the FP32 error at each output (Σ|a·b|·α, spec §6,
    propagated through the SwiGLU), the raw float64 GEMM)."""
    ref = nvfp4_gemm_reference(a.packed, a.scales, a.global_scale, b_packed, b_scales, b_global,
                               a_scale_layout=a.scale_layout)
    a_abs = _dequant_abs(a.packed, a.scales if a.scale_layout == "linear" else
                         unswizzle_32_4_4(a.scales, a.rows, a.k // 16))
    b_abs = _dequant_abs(b_packed, b_scales)
    sabs = (a_abs @ b_abs.T) * (a.global_scale.double() * b_global.double())
    if swiglu is not None:
        # FP32 errors dg, du of gate and up (~ sabs each) reach the output scaled by the
        # derivatives: |d out| <= |silu'(g)| |u| dg + |silu(g)| du, with |silu'| <= 1.1.
        n = ref.shape[1] // 2
        g, u = ref[:, :n].clamp(max=swiglu), ref[:, n:].clamp(-swiglu, swiglu)
        scale = 1.1 * u.abs() * sabs[:, :n] + F.silu(g).abs() * sabs[:, n:]
        return _swiglu64(ref, swiglu), scale, ref
    return ref, sabs, ref


def _dequant_abs(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    vals = e2m1_decode(unpack_nibbles(packed)).double().abs()
    return vals * e4m3_decode(scales).double().abs().repeat_interleave(16, dim=1)


def assert_within_bound(y: torch.Tensor, ref: torch.Tensor, sabs: torch.Tensor, what: str,
                        ulps: int = 1) -> None:
    """Spec §6: a few FP32 ulps of Σ|a·b|·α before the cast, at most 1 BF16 ulp from the cast
    (``ulps`` = 2 when ``ref`` is itself a BF16-rounded result)."""
    yd, rd = y.double(), ref.double().to(y.device)
    mag = torch.maximum(yd.abs(), rd.abs()).clamp(min=2.0 ** -126)
    bf16_ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    tol = ulps * bf16_ulp + 8 * 2.0 ** -24 * (sabs.to(y.device) + rd.abs())
    err = (yd - rd).abs()
    bad = ~(err <= tol)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} outside the bound; worst err "
                           f"{float((err - tol).max()):.3e} over tolerance at {torch.nonzero(bad)[0].tolist()}")


def assert_experts_within_bound(y: torch.Tensor, a: FP4Operand, b: FP4Operand, offsets: list[int],
                                swiglu: float | None, what: str) -> None:
    """Each expert's rows of a grouped GEMM output against the oracle for that expert alone."""
    e = len(offsets) - 1
    for ex in range(e):
        lo, hi = offsets[ex], offsets[ex + 1]
        if lo == hi:
            continue
        bp, bs, bg = _expert_operand(b, ex, e)
        a_e = FP4Operand(a.packed[lo:hi], a.scales[lo:hi], a.global_scale, k=a.k)
        ref, sabs, _ = _reference(a_e, bp, bs, bg, swiglu)
        assert_within_bound(y[lo:hi], ref, sabs, f"{what} expert {ex} rows {lo}:{hi}")


def test_the_bound_accepts_one_bf16_ulp_and_rejects_three():
    a, b = _operand(64, 256, 5), _operand(96, 256, 6)
    ref, sabs, _ = _reference(a, b.packed, b.scales, b.global_scale, None)
    y = ref.to(torch.bfloat16)
    assert_within_bound(y, ref, sabs, "round to nearest")
    off = (ref + 3 * torch.exp2(torch.floor(torch.log2(ref.abs().clamp(min=2.0 ** -126))) - 7)).to(torch.bfloat16)
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_within_bound(off, ref, sabs, "three ulps")


# ---- swizzle and the kernel's scale view ----------------------------------------------------------
@pytest.mark.parametrize("rows,cols", [(1, 2), (128, 4), (130, 6), (257, 448), (64, 2)])
def test_edge_swizzle_matches_oracle_and_roundtrips(rows, cols):
    s = torch.randint(0, 256, (rows, cols), dtype=torch.uint8).view(torch.float8_e4m3fn)
    flat = swizzled_scales(s, "linear", rows, 16 * cols).view(torch.uint8)
    s = s.view(torch.uint8)
    assert torch.equal(flat, swizzle_scales(s))
    assert flat.numel() == math.ceil(rows / 128) * 128 * math.ceil(cols / 4) * 4
    assert torch.equal(unswizzle_32_4_4(flat, rows, cols), s)
    # spec §3.6 formula, element by element for a few entries
    cp = math.ceil(cols / 4) * 4
    for r, c in [(0, 0), (rows - 1, cols - 1), (rows // 2, cols // 2)]:
        mt, rr = divmod(r, 128)
        r1, r0 = divmod(rr, 32)
        kt, cc = divmod(c, 4)
        assert flat[((mt * (cp // 4) + kt) * 32 + r0) * 16 + r1 * 4 + cc] == s[r, c]


@needs_cutlass
@pytest.mark.parametrize("rows,k,batches", [(1, 32, 1), (200, 96, 3), (256, 512, 2)])
def test_kernel_scale_view_reads_the_contract_bytes(rows, k, batches):
    """The kernel's SFA/SFB tensor (its layout code, run on the CPU) over per-batch swizzled bytes
    returns the linear scale of every (row, 16-block, batch): padding and batch stride included."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    lin = torch.randint(0, 256, (batches, rows, k // 16), dtype=torch.uint8)
    flat = swizzle_scales(lin).reshape(-1)
    assert torch.equal(kernel_scale_view(flat, rows, k, batches), lin)
    # negative control: a plain row-major buffer is NOT what the kernel reads
    if rows > 1:
        wrong = torch.zeros(flat.numel(), dtype=torch.uint8)
        wrong[:lin.numel()] = lin.reshape(-1)
        assert not torch.equal(kernel_scale_view(wrong, rows, k, batches), lin)


@needs_cutlass
@pytest.mark.parametrize("half", [128, 96])
def test_swiglu_view_gives_gate_and_up_batches(half):
    """[gate; up] per expert, swizzled per expert -> batch 2e = gate rows, 2e+1 = up rows of expert e.
    n/2 = 128 must be a zero-copy view; n/2 = 96 is repacked."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    experts, k = 2, 64
    lin = torch.randint(0, 256, (experts, 2 * half, k // 16), dtype=torch.uint8)
    flat = swizzle_scales(lin).reshape(-1)
    view = swiglu_half_scales(flat, experts, 2 * half, k)
    assert (view.data_ptr() == flat.data_ptr()) == (half % 128 == 0)
    got = kernel_scale_view(view, half, k, 2 * experts)
    for e in range(experts):
        assert torch.equal(got[2 * e], lin[e, :half])
        assert torch.equal(got[2 * e + 1], lin[e, half:])


# ---- the grouped schedule -----------------------------------------------------------------------
@pytest.mark.parametrize("offsets", [
    [0, 1], [0, 0, 0, 5, 5], [0, 70, 200, 200, 333], [0, 128, 256], [0, 0, 0], [0, 127, 129, 1000],
])
def test_grouped_schedule_covers_every_row_once(offsets):
    sched = grouped_schedule(offsets)
    assert sched.dtype == torch.int32 and sched.shape[1] == 4
    m = offsets[-1]
    owner = torch.full((m,), -1)
    for e, mt, lo, hi in sched.tolist():
        assert (lo, hi) == (offsets[e], offsets[e + 1]) and hi > lo  # empty experts get no work
        rows = torch.arange(mt * TILE_M, (mt + 1) * TILE_M)
        rows = rows[(rows >= lo) & (rows < hi)]
        assert rows.numel() > 0, "a scheduled tile must own a row"
        assert (owner[rows] == -1).all(), "a row stored twice"
        owner[rows] = e
    assert (owner >= 0).all(), "a row never stored"
    # work = tiles touched by each expert: at most M tiles + one boundary tile per expert
    assert sched.shape[0] <= math.ceil(m / TILE_M) + (len(offsets) - 1)


def test_choose_config_is_a_compiled_config():
    for m, nb, sw, gr in [(1, 7168, False, False), (4096, 7168, False, False), (4096, 1024, True, False),
                          (9, 2048, False, True), (9, 2048, True, True)]:
        assert choose_config(m, nb, swiglu=sw, grouped=gr) in CONFIGS
    assert choose_config(4096, 7168, swiglu=False, grouped=False).bn == 256
    assert choose_config(1, 7168, swiglu=False, grouped=False).bn == 128


# ---- packing ------------------------------------------------------------------------------------
def test_prepare_gemm_swizzles_at_the_edge_and_forms_alpha():
    a, b = _operand(130, 96, 1), _operand(200, 96, 2)
    args = Sm100Backend("cpu").prepare_gemm(GemmRequest(a, b))
    assert torch.equal(args.sfa.view(torch.uint8), swizzle_scales(a.scales.view(torch.uint8)))
    assert torch.equal(args.sfb.view(torch.uint8), swizzle_scales(b.scales.view(torch.uint8)))
    assert args.alpha.dtype == torch.float32 and args.alpha.shape == (1,)
    assert args.alpha.item() == (a.global_scale * b.global_scale).item()
    assert (args.m, args.nb, args.k, args.lb, args.num_work) == (130, 200, 96, 1, 2)
    assert args.out.shape == (130, 200) and args.out.dtype == torch.bfloat16
    assert args.grid == (2, 2, 1)
    # already swizzled: passed through untouched (no copy)
    a_sw = _operand(130, 96, 1, layout="swizzled")
    args2 = Sm100Backend("cpu").prepare_gemm(GemmRequest(a_sw, b))
    assert args2.sfa.data_ptr() == a_sw.scales.data_ptr()


def test_prepare_grouped_per_expert_batches_alphas_and_schedule():
    e, n, k = 3, 64, 64
    a = _operand(40, k, 3)
    b = _operand(e * n, k, 4, layout="swizzled", groups=e)
    offsets = torch.tensor([0, 0, 25, 40], dtype=torch.int32)
    alphas = (a.global_scale * b.global_scale).to(torch.float32)
    args = Sm100Backend("cpu").prepare_grouped(GroupedGemmRequest(a, b, offsets, alphas))
    assert (args.nb, args.lb, args.cfg.grouped, args.cfg.swiglu) == (n, e, True, False)
    # built on the device, its length fixed by M and E (ceil(40/128) + min(3, 40) - 1 = 3): the real rows,
    # then a row that stores nothing
    assert args.sched.tolist() == [[1, 0, 0, 25], [2, 0, 25, 40], [0, 0, 0, 0]]
    assert args.num_work == 3 and torch.equal(args.alpha, alphas)
    sw = Sm100Backend("cpu").prepare_grouped(GroupedGemmRequest(a, b, offsets, alphas, swiglu_limit=7.0))
    assert (sw.nb, sw.lb, sw.swiglu_limit, sw.cfg.swiglu) == (n // 2, 2 * e, 7.0, True)


# ---- validation -----------------------------------------------------------------------------------
def test_k_not_a_multiple_of_32_is_rejected_before_launch():
    a, b = _operand(4, 48, 1), _operand(8, 48, 2)
    with pytest.raises(KernelContractError, match=r"K: expected a multiple of 32.*found 48"):
        Sm100Backend("cpu").prepare_gemm(GemmRequest(a, b))


def test_output_too_large_for_32_bit_indexing_is_rejected():
    assert launch_problems(2**16, 2**15, 64, {}) == [
        "output elements M*N: expected < 2^31 (32-bit epilogue indexing), found 65536*32768"]
    assert launch_problems(2**16, 2**15 - 1, 64, {}) == []


def test_misaligned_operand_is_rejected():
    a, b = _operand(4, 64, 1), _operand(8, 64, 2)
    buf = torch.zeros(a.packed.numel() + 1, dtype=torch.uint8)
    shifted = buf[1:].view(a.packed.shape)
    shifted.copy_(a.packed)
    bad = FP4Operand(shifted, a.scales, a.global_scale, k=a.k)
    with pytest.raises(KernelContractError, match=r"a data_ptr: expected 16-byte aligned"):
        Sm100Backend("cpu").prepare_gemm(GemmRequest(bad, b))


def test_wrong_per_expert_scale_numel_names_expected_and_found():
    e, n, k = 2, 64, 64
    a = _operand(10, k, 3)
    b = _operand(e * n, k, 4, layout="swizzled", groups=e)
    short = FP4Operand(b.packed, b.scales[:-16], b.global_scale, k=k, scale_layout="swizzled")
    req = GroupedGemmRequest(a, short, torch.tensor([0, 4, 10], dtype=torch.int32), torch.ones(e))
    with pytest.raises(KernelContractError, match=r"expected 1024 .*found 1008"):
        Sm100Backend("cpu").grouped_gemm(req)


def test_cpu_tensors_are_refused_by_the_launch_path():
    a, b = _operand(4, 64, 1), _operand(8, 64, 2)
    with pytest.raises(KernelContractError, match=r"operands device: expected a CUDA tensor, found cpu"):
        Sm100Backend("cpu").gemm(GemmRequest(a, b))


def test_activation_quantization_is_refused_on_cpu():
    x = torch.zeros(4, 64, dtype=torch.bfloat16)
    with pytest.raises(KernelContractError, match=r"operands device: expected a CUDA tensor, found cpu"):
        Sm100Backend("cpu").quantize_activation(ActQuantRequest(x))


@needs_cutlass
def test_registry_builds_this_backend_and_labels_it_when_no_b200_is_present():
    from dsv4.kernels.registry import backend_info

    info = backend_info("cutedsl_sm100")
    be = info.factory(torch.device("cpu"))
    assert isinstance(be, Sm100Backend) and be.name == "cutedsl_sm100"
    has_b200 = torch.cuda.is_available() and any(
        torch.cuda.get_device_capability(i)[0] == 10 for i in range(torch.cuda.device_count()))
    assert (info.note == "compiled, not executed here") == (not has_b200)


@needs_cutlass
def test_compiled_kernels_are_cached_per_arch_and_config(monkeypatch):
    from dsv4.kernels.cutedsl.sm100 import launch

    compiled, launched = [], []
    monkeypatch.setattr(launch, "compile_kernel", lambda cfg, arch: compiled.append((cfg, arch)) or object())
    monkeypatch.setattr(launch, "launch", lambda exe, args: launched.append(args))
    be = Sm100Backend("cpu")
    for m in (1, 300):  # different shapes, same configuration: one compile
        be._run(be.prepare_gemm(GemmRequest(_operand(m, 64, 1), _operand(8, 64, 2))), "sm_100a")
    assert len(compiled) == 1 and len(launched) == 2
    be._run(be.prepare_gemm(GemmRequest(_operand(3, 64, 1), _operand(8, 64, 2))), "sm_103a")
    be._run(be.prepare_gemm(GemmRequest(_operand(3, 64, 1), _operand(8, 64, 2), swiglu_limit=1.0)), "sm_100a")
    assert len(compiled) == 3 and be.cache.compiles == 3
    # nothing to compute: no compile, no launch
    be._run(be.prepare_gemm(GemmRequest(_operand(0, 64, 1), _operand(8, 64, 2))), "sm_100a")
    assert len(launched) == 4


# ---- a CPU model of the kernel, fed with the packed launch arguments -----------------------------------
def kernel_model(args: LaunchArgs) -> torch.Tensor:
    """What ``kernel.py`` computes from ``args``, tile by tile: 128 x bn tiles of the grid / schedule,
    TMA zero fill past M / N / K, scales read through the kernel's own view, FP32 accumulator times
    alpha[expert], optional SwiGLU in FP32, BF16, stores only inside [row_lo, row_hi) x [0, nb).
    Every output element must be stored exactly once."""
    from dsv4.kernels.cutedsl.sm100.host_view import kernel_scale_view

    k, m, nb, bn = args.k, args.m, args.nb, args.cfg.bn
    sfa = e4m3_decode(kernel_scale_view(args.sfa, m, k, 1)[0]).double().repeat_interleave(16, 1)
    a = e2m1_decode(unpack_nibbles(args.a)).double() * sfa
    sfb = e4m3_decode(kernel_scale_view(args.sfb, nb, k, args.lb)).double().repeat_interleave(16, 2)
    b = e2m1_decode(unpack_nibbles(args.b.view(args.lb, nb, k // 2))).double() * sfb
    out = torch.zeros(m, nb, dtype=torch.bfloat16)
    stores = torch.zeros(m, nb, dtype=torch.int32)
    work = (args.sched.tolist() if args.cfg.grouped
            else [(0, mt, 0, m) for mt in range(args.num_work)])
    nb_per = 2 if args.cfg.swiglu else 1
    for e, mt, lo, hi in work:
        rows = torch.arange(mt * TILE_M, (mt + 1) * TILE_M)
        rows = rows[(rows >= lo) & (rows < hi) & (rows < m)]
        for nt in range(args.grid[1]):
            cols = torch.arange(nt * bn, min((nt + 1) * bn, nb))
            acc = (a[rows] @ b[e * nb_per][cols].T).float()
            v = acc * args.alpha[e]
            if args.cfg.swiglu:
                u = (a[rows] @ b[e * nb_per + 1][cols].T).float() * args.alpha[e]
                g = v.clamp(max=args.swiglu_limit)
                v = g / (1 + torch.exp(-g)) * u.clamp(-args.swiglu_limit, args.swiglu_limit)
            out[rows[:, None], cols] = v.to(torch.bfloat16)
            stores[rows[:, None], cols] += 1
    assert torch.all(stores == 1), "every output element is stored exactly once"
    return out


@needs_cutlass
@pytest.mark.parametrize("m,n,k,layout", [(1, 64, 64, "linear"), (130, 200, 96, "swizzled"),
                                          (257, 384, 512, "linear"), (64, 256, 256, "swizzled")])
@pytest.mark.parametrize("swiglu", [None, 3.0])
def test_model_of_dense_launch_matches_reference(m, n, k, layout, swiglu):
    a = _operand(m, k, 11, layout=layout)
    b = _operand(n, k, 12, layout=layout)
    args = Sm100Backend("cpu").prepare_gemm(GemmRequest(a, b, swiglu_limit=swiglu))
    y = kernel_model(args)
    b_lin = b.scales if layout == "linear" else unswizzle_32_4_4(b.scales, n, k // 16)
    ref, sabs, raw = _reference(a, b.packed, b_lin, b.global_scale, swiglu)
    if swiglu is not None:  # the limit must actually bite for the test to mean something
        assert (raw[:, : n // 2] > swiglu).any() and (raw[:, n // 2:].abs() > swiglu).any()
    assert_within_bound(y, ref, sabs, f"dense m={m} n={n} k={k} swiglu={swiglu}")


@needs_cutlass
@pytest.mark.parametrize("offsets", [[0, 1], [0, 0, 70, 200, 200, 333], [0, 0, 0, 3]])
@pytest.mark.parametrize("swiglu", [None, 2.5])
def test_model_of_grouped_launch_matches_reference(offsets, swiglu):
    e, n, k = len(offsets) - 1, 192, 64
    a = _operand(offsets[-1], k, 21)
    b = _operand(e * n, k, 22, layout="swizzled", groups=e)
    alphas = (a.global_scale * b.global_scale).to(torch.float32)
    req = GroupedGemmRequest(a, b, torch.tensor(offsets, dtype=torch.int32), alphas, swiglu_limit=swiglu)
    y = kernel_model(Sm100Backend("cpu").prepare_grouped(req))
    assert y.shape == req.out_shape
    assert_experts_within_bound(y, a, b, offsets, swiglu, "grouped")


# ---- compile-only: PTX of every configuration -----------------------------------------------------
_COMPILE_CPU_SECONDS: list[float] = []


@pytest.fixture(scope="module")
def builds():
    from dsv4.kernels.cutedsl.sm100 import compile_for_check

    t0 = time.process_time()  # CPU time: wall time swings with whatever else shares the CI cores
    out = compile_for_check()
    _COMPILE_CPU_SECONDS.append(time.process_time() - t0)
    return out


@needs_cutlass
def test_every_configuration_compiles_for_sm100a_with_block_scaled_mma(builds):
    assert [b.name for b in builds] == [f"cutedsl_sm100.nvfp4_gemm.{c.tag}" for c in CONFIGS]
    for b in builds:
        assert b.arch == "sm_100a"
        assert b.ok, f"{b.name}: {b.problems()}"
        assert b.census()[r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale"] >= 4
    assert _COMPILE_CPU_SECONDS[0] < 30, f"compile budget for CI: {_COMPILE_CPU_SECONDS[0]:.1f} CPU s"


@needs_cutlass
def test_swiglu_kernels_issue_two_mmas_per_k_block(builds):
    """Gate and up accumulate separately: twice the MMAs, twice the B/SFB TMA loads."""
    by = {b.name.rsplit(".", 1)[1]: b for b in builds}
    mma = r"tcgen05\.mma\.cta_group::1\.kind::mxf4nvf4\.block_scale"
    for kind in ("dense", "grouped"):
        plain, sw = by[f"{kind}_plain_n128"], by[f"{kind}_swiglu_n128"]
        assert sw.census()[mma] == 2 * plain.census()[mma]


@needs_cutlass
def test_preflight_rejects_a_ptx_without_the_block_scaled_mma(builds):
    from dataclasses import replace

    b = builds[0]
    stripped = replace(b, ptx=b.ptx.replace("kind::mxf4nvf4", "kind::f16"))
    assert not stripped.ok
    assert any("mxf4nvf4" in p for p in stripped.problems())


@needs_cutlass
def test_the_kernel_does_not_compile_for_hopper():
    from dsv4.kernels.cutedsl.sm100.compile import compile_one

    b = compile_one(KernelConfig(128, False, False), "sm_90a")
    assert b.error is not None and not b.ok


# ---- B200 only ----------------------------------------------------------------------------------
def _cuda_operand(rows, k, seed, **kw) -> FP4Operand:
    return _operand(rows, k, seed, device="cuda", **kw)


@pytest.fixture(scope="module")
def backend():
    return Sm100Backend("cuda")


@pytest.mark.parametrize("m,n,k", [(1, 7168, 2048), (130, 200, 96), (512, 4096, 7168), (2048, 3072, 1024)])
@pytest.mark.parametrize("layout", ["linear", "swizzled"])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_dense_matches_reference(backend, m, n, k, layout):
    a, b = _cuda_operand(m, k, 31, layout=layout), _cuda_operand(n, k, 32, layout=layout)
    y = backend.gemm(GemmRequest(a, b))
    b_lin = b.scales if layout == "linear" else unswizzle_32_4_4(b.scales, n, k // 16)
    ref, sabs, _ = _reference(a, b.packed, b_lin, b.global_scale, None)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    assert_within_bound(y, ref, sabs, f"B200 dense {m}x{n}x{k} {layout}")


@pytest.mark.parametrize("m,n,k", [(1, 2 * 2048, 7168), (300, 2 * 96, 512)])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_dense_swiglu_beyond_the_limit(backend, m, n, k):
    limit = 10.0
    a, b = _cuda_operand(m, k, 41, spread=40.0), _cuda_operand(n, k, 42)
    y = backend.gemm(GemmRequest(a, b, swiglu_limit=limit))
    ref, sabs, raw = _reference(a, b.packed, b.scales, b.global_scale, limit)
    assert (raw[:, : n // 2] > limit).any() and (raw[:, n // 2:].abs() > limit).any()
    assert_within_bound(y, ref, sabs, f"B200 SwiGLU {m}x{n}x{k}")


@pytest.mark.parametrize("offsets", [[0, 1], [0, 0, 70, 200, 200, 333], [0] * 8 + [1],
                                     [0, 128, 256, 4000, 4096]])
@pytest.mark.parametrize("swiglu", [None, 10.0])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_grouped_ragged_and_empty_groups(backend, offsets, swiglu):
    e, n, k = len(offsets) - 1, 2 * 384, 2048
    a = _cuda_operand(offsets[-1], k, 51, spread=30.0)
    b = _cuda_operand(e * n, k, 52, layout="swizzled", groups=e)
    alphas = (a.global_scale * b.global_scale).to(torch.float32)
    y = backend.grouped_gemm(GroupedGemmRequest(a, b, torch.tensor(offsets, dtype=torch.int32, device="cuda"),
                                                alphas, swiglu_limit=swiglu))
    assert_experts_within_bound(y, a, b, offsets, swiglu, f"B200 grouped swiglu={swiglu}:")


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_linear_and_swizzled_scales_give_identical_bits(backend):
    a_l, b_l = _cuda_operand(200, 1024, 61), _cuda_operand(640, 1024, 62)
    a_s, b_s = _cuda_operand(200, 1024, 61, layout="swizzled"), _cuda_operand(640, 1024, 62, layout="swizzled")
    assert torch.equal(backend.gemm(GemmRequest(a_l, b_l)), backend.gemm(GemmRequest(a_s, b_s)))


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_matches_torch_scaled_mm_nvfp4(backend):
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if fp4 is None:
        pytest.skip(f"torch {torch.__version__} has no float4_e2m1fn_x2 dtype")
    m, n, k = 256, 512, 2048
    a, b = _cuda_operand(m, k, 71, layout="swizzled"), _cuda_operand(n, k, 72, layout="swizzled")
    alpha = a.global_scale * b.global_scale
    args = (a.packed.view(fp4), b.packed.view(fp4).t())
    kw = dict(scale_a=a.scales, scale_b=b.scales)
    try:  # cuBLASLt NVFP4: block scales only, so alpha is applied here in FP32
        want = (torch._scaled_mm(*args, **kw, out_dtype=torch.float32) * alpha).to(torch.bfloat16)
        ulps = 1
    except (RuntimeError, TypeError):
        try:  # some builds only emit BF16 from the FP4 path: one more rounding before alpha
            want = (torch._scaled_mm(*args, **kw, out_dtype=torch.bfloat16).float() * alpha).to(torch.bfloat16)
            ulps = 2
        except (RuntimeError, TypeError) as e:
            pytest.skip(f"torch {torch.__version__}: torch._scaled_mm has no NVFP4 path here ({e})")
    got = backend.gemm(GemmRequest(a, b))
    ref, sabs, _ = _reference(a, b.packed, unswizzle_32_4_4(b.scales, n, k // 16), b.global_scale, None)
    assert_within_bound(want, ref, sabs, "torch._scaled_mm vs reference", ulps)  # the cross-check is sound
    assert_within_bound(got, want, sabs, "kernel vs torch._scaled_mm", ulps + 1)


@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_reuses_the_compiled_kernel_across_shapes(backend):
    before = backend.cache.compiles
    for m in (3, 77, 129):
        backend.gemm(GemmRequest(_cuda_operand(m, 256, 81), _cuda_operand(256, 256, 82)))
    assert backend.cache.compiles - before <= 1


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
@pytest.mark.gpu
@pytest.mark.sm100
@pytest.mark.parity
def test_b200_activation_quantizer_matches_the_oracle_and_feeds_the_gemm(backend, layout):
    from dsv4.kernels.emulated import EmulatedBackend

    x = _x(300, 2048, 91, device="cuda")
    g = torch.tensor(0.01, dtype=torch.float32, device="cuda")
    for gs in (g, None):  # static (checkpoint input_scale) and runtime amax global scale
        req = ActQuantRequest(x, global_scale=gs, scale_layout=layout)
        got, want = backend.quantize_activation(req), EmulatedBackend().quantize_activation(req)
        assert torch.equal(got.packed, want.packed)
        assert torch.equal(got.scales.view(torch.uint8), want.scales.view(torch.uint8))
        assert torch.equal(got.global_scale, want.global_scale)
    b = _cuda_operand(512, 2048, 92, layout="swizzled")
    y = backend.gemm(GemmRequest(got, b))
    a_lin = got.scales if layout == "linear" else unswizzle_32_4_4(got.scales, 300, 2048 // 16)
    a_op = FP4Operand(got.packed, a_lin, got.global_scale, k=2048)
    ref, sabs, _ = _reference(a_op, b.packed, unswizzle_32_4_4(b.scales, 512, 128), b.global_scale, None)
    assert_within_bound(y, ref, sabs, f"B200 quantize -> gemm ({layout})")
