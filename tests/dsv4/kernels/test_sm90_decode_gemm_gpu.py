"""The sm_90a decode GEMM (``DecodeGemm``, M <= 16 tokens) on a Hopper GPU, judged like the sm90
backend's GEMMs (``gpu`` + ``sm90``; conftest skips them elsewhere).

Bound (copied from test_cutedsl_sm90.py, spec nvfp4-and-kernels.md §6): both operands are exact in
FP16, every product exact in FP32, so the kernel and the float64 reference differ only by FP32
accumulation; per output element

    |y_kernel - y_ref| <= 0.5 * ulp_bf16(max(|y_kernel|, |y_ref|)) + (K/16 + 16) * 2^-23 * alpha * sum_k |a_k b_k|

The emulated backend (the contract's executable definition) obeys the same bound, so the kernel is
also checked against it at twice the accumulation term. Results are recorded in ``DSV4_GPU_REPORT``
(JSONL) when set.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dsv4.kernels.contract import FP4Operand, GemmRequest, GroupedGemmRequest, KernelContractError

sys.path.insert(0, str(Path(__file__).parent))   # the shared helpers beside this file
from sm90_gpu_operands import _deq, _report, _ulp_bf16  # noqa: E402
from sm90_gpu_operands import _operand as _any_operand  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


@pytest.fixture(scope="module")
def dg():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    return DecodeGemm("cuda")


@pytest.fixture(scope="module")
def emu():
    from dsv4.kernels.emulated import EmulatedBackend

    return EmulatedBackend()


# ----------------------------------------------------------------------------- operands (swizzled scales by default)
def _operand(*args, layout: str = "swizzled", **kw) -> FP4Operand:
    return _any_operand(*args, layout=layout, **kw)


def _check_gemm(got, a, b, alpha, k, label, acc_factor=1.0):
    ref = (a @ b.T) * alpha
    s = (a.abs() @ b.abs().T) * alpha.abs()
    g = got.double()
    err = (g - ref).abs()
    tol = 0.5 * _ulp_bf16(torch.maximum(g.abs(), ref.abs())) + acc_factor * (k / 16 + 16) * 2.0 ** -23 * s
    bad = ~(err <= tol)
    _report("decode_gemm", label=label, shape=list(got.shape), k=k,
            frac_bf16_identical=float((got == ref.to(torch.bfloat16)).float().mean()),
            worst=float(err.max()) if got.numel() else 0.0)
    if bool(bad.any()):
        idx = bad.nonzero()[:8].tolist()
        rows = sorted({i for i, _ in bad.nonzero().tolist()})
        cols = sorted({j for _, j in bad.nonzero().tolist()})
        raise AssertionError(f"{label}: {int(bad.sum())}/{bad.numel()} outside the bound; first {idx}; "
                             f"got {[float(g[i, j]) for i, j in idx[:4]]} ref {[float(ref[i, j]) for i, j in idx[:4]]}; "
                             f"bad rows {rows[:16]}..({len(rows)}) cols {cols[:16]}..({len(cols)})")


def _check_swiglu(got, a, b, alpha, k, limit, label):
    y = (a @ b.T) * alpha
    s = (a.abs() @ b.abs().T) * alpha.abs()
    n = y.shape[-1] // 2
    gate, up = y[:, :n].clamp(max=limit), y[:, n:].clamp(-limit, limit)
    ref = F.silu(gate) * up
    delta = (k / 16 + 16) * 2.0 ** -23 * s
    g = got.double()
    tol = (0.5 * _ulp_bf16(torch.maximum(g.abs(), ref.abs())) + 1.1 * limit * delta[:, :n]
           + max(limit, 0.3) * delta[:, n:] + 2.0 ** -20 * ref.abs())
    bad = ~((g - ref).abs() <= tol)
    _report("decode_swiglu", label=label, shape=list(got.shape),
            frac_beyond_limit=float(((y[:, :n] > limit) | (y[:, n:].abs() > limit)).double().mean()))
    assert not bool(bad.any()), f"{label}: {int(bad.sum())} outside the bound, first {bad.nonzero()[:4].tolist()}"


def _alpha(a, b):
    return (a.global_scale * b.global_scale).double()


# ----------------------------------------------------------------------------- dense
SHAPES = [(7168, 2048), (6144, 7168), (3072, 7168), (1536, 7168), (130, 1056), (200, 96), (40, 320), (8, 32),
          (1000, 4128)]


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_decode_gemm_matches_reference_and_emulated(dg, emu, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    a, b = _operand(m, k, gen), _operand(n, k, gen)
    req = GemmRequest(a, b)
    got = dg(req)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    plan = dg.plan(m, n, k, False)
    label = f"decode m{m} n{n} k{k} tiles{plan.tiles} splits{plan.splits}"
    _check_gemm(got, _deq(a), _deq(b), _alpha(a, b), k, label)
    # vs the emulated backend: both within the bound of the exact result, so within twice of each other
    ref_emu = emu.gemm(req).double()
    ad, bd = _deq(a), _deq(b)
    s = (ad.abs() @ bd.abs().T) * _alpha(a, b).abs()
    g = got.double()
    tol = _ulp_bf16(torch.maximum(g.abs(), ref_emu.abs())) + 2 * (k / 16 + 16) * 2.0 ** -23 * s
    diff = (g - ref_emu).abs()
    _report("decode_vs_emulated", label=label, max_abs_diff=float(diff.max()),
            frac_identical=float((g == ref_emu).double().mean()))
    assert bool((diff <= tol).all()), f"{label}: {int((diff > tol).sum())} outputs differ from the emulated backend"


@pytest.mark.parametrize("m", [1, 16])
def test_decode_gemm_single_products_are_bit_exact_at_extreme_scales(dg, m):
    """Weights with one nonzero-slot code per row (every code, every K position, both halves of the
    MMA fragments) times dense tokens (every code), block scales drawn from the extremes of E4M3
    (2^-9 .. 448): every output is one exact product times alpha, so the kernel must equal
    bf16(fp32(product) * alpha) bit for bit. The decode hands the tensor cores e2m1 x scale x 2^-14
    (FP16 subnormals below 1, down to 2^-24) and scales the FP32 accumulators back by 2^28; this
    pins that path to the exact operands (a tensor core flushing FP16 subnormals would fail here)."""
    gen = torch.Generator().manual_seed(m + 5)
    n, k = 512, 96
    codes_a = torch.randint(0, 16, (m, k), generator=gen)
    codes_b = torch.zeros(n, k, dtype=torch.long)
    rows = torch.arange(n)
    codes_b[rows, (rows * 7 + rows // k) % k] = rows % 16
    pick = torch.tensor([0x01, 0x02, 0x07, 0x08, 0x0F, 0x30, 0x38, 0x3B, 0x77, 0x7E], dtype=torch.uint8)

    def op(codes):
        packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
        sc = pick[torch.randint(0, len(pick), (codes.shape[0], k // 16), generator=gen)].view(torch.float8_e4m3fn)
        g = torch.exp2(torch.randint(-3, 4, (), generator=gen).float()) * 0.75
        return FP4Operand(packed.cuda(), sc.cuda(), g.cuda(), k=k, scale_layout="linear")

    a, b = op(codes_a), op(codes_b)
    got = dg(GemmRequest(a, b))
    alpha32 = a.global_scale.float() * b.global_scale.float()
    ref = ((_deq(a) @ _deq(b).T).float() * alpha32).to(torch.bfloat16)  # one product per output: exact
    assert torch.equal(got, ref), f"{int((got != ref).sum())} of {got.numel()} outputs differ"


@pytest.mark.parametrize("m", [1, 5, 9, 16])
@pytest.mark.parametrize("layouts", [("linear", "linear"), ("linear", "swizzled")])
def test_decode_gemm_linear_scales(dg, m, layouts):
    gen = torch.Generator().manual_seed(m + 77)
    k, n = 544, 300
    a, b = _operand(m, k, gen, layout=layouts[0]), _operand(n, k, gen, layout=layouts[1])
    _check_gemm(dg(GemmRequest(a, b)), _deq(a), _deq(b), _alpha(a, b), k, f"linear m{m} {layouts}")


@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("nh,k", [(3072, 7168), (40, 96), (96, 1056), (200, 2048)])
def test_decode_gemm_swiglu(dg, m, nh, k):
    gen = torch.Generator().manual_seed(m * 31 + nh + k)
    a, b = _operand(m, k, gen), _operand(2 * nh, k, gen)
    a = FP4Operand(a.packed, a.scales, a.global_scale * 4, k=k, scale_layout=a.scale_layout)
    limit = 7.0
    got = dg(GemmRequest(a, b, swiglu_limit=limit))
    assert got.shape == (m, nh)
    _check_swiglu(got, _deq(a), _deq(b), _alpha(a, b), k, limit, f"swiglu m{m} nh{nh} k{k}")


@pytest.mark.parametrize("plan_kw", [dict(bk=128, stages=6), dict(consumer_warps=8, stages=8, ctas_per_sm=1),
                                     dict(stages=2), dict(max_splits=1), dict(rows=64), dict(rows=64, bk=128),
                                     dict(rows=256, ctas_per_sm=1), dict(rows=256, consumer_warps=8, ctas_per_sm=1),
                                     dict(max_splits=32, ctas_per_sm=3, stages=3), dict(copy16=False),
                                     dict(copy16=False, reduce_ilp=False), dict(reduce_ilp=False),
                                     dict(rows=256, ctas_per_sm=1), dict(max_splits=32, ctas_per_sm=3)])
def test_decode_gemm_other_configs(plan_kw):
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    dgx = DecodeGemm("cuda", **plan_kw)
    gen = torch.Generator().manual_seed(len(str(plan_kw)))
    for m, n, k in [(1, 4096, 7168), (16, 130, 1056), (7, 1000, 2080)]:
        a, b = _operand(m, k, gen), _operand(n, k, gen)
        _check_gemm(dgx(GemmRequest(a, b)), _deq(a), _deq(b), _alpha(a, b), k, f"{plan_kw} m{m} n{n} k{k}")
    for m, nh, k in [(3, 40, 96), (16, 200, 2048)]:
        a, b = _operand(m, k, gen), _operand(2 * nh, k, gen)
        a = FP4Operand(a.packed, a.scales, a.global_scale * 4, k=k, scale_layout=a.scale_layout)
        _check_swiglu(dgx(GemmRequest(a, b, swiglu_limit=7.0)), _deq(a), _deq(b), _alpha(a, b), k, 7.0,
                      f"{plan_kw} swiglu m{m} nh{nh} k{k}")


def test_decode_gemm_deterministic_counters_reset_and_matches_backend(dg):
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend

    gen = torch.Generator().manual_seed(3)
    a, b = _operand(4, 7168, gen), _operand(3072, 7168, gen)
    outs = [dg(GemmRequest(a, b)) for _ in range(4)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert dg._counters is not None and int(dg._counters.abs().sum()) == 0
    ref = Sm90Backend("cuda").gemm(GemmRequest(a, b))
    diff = (outs[0].float() - ref.float()).abs()
    _report("decode_vs_sm90_backend", max_abs_diff=float(diff.max()),
            frac_identical=float((outs[0] == ref).float().mean()))
    # both are within the FP32-reordering bound of the exact result
    _check_gemm(ref, _deq(a), _deq(b), _alpha(a, b), 7168, "sm90 backend")
    _check_gemm(outs[0], _deq(a), _deq(b), _alpha(a, b), 7168, "decode")


def test_decode_gemm_cuda_graph_replay(dg):
    gen = torch.Generator().manual_seed(8)
    a, b = _operand(2, 2048, gen), _operand(7168, 2048, gen)
    req = GemmRequest(a, b)
    eager = dg(req)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dg(req)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dg(req)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_decode_gemm_rejects_what_it_does_not_support(dg):
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    gen = torch.Generator().manual_seed(1)
    b = _operand(64, 48, gen)
    req = GemmRequest(_operand(2, 48, gen), b)  # K % 32 != 0
    assert not DecodeGemm.supports(req)
    with pytest.raises(KernelContractError):
        dg(req)
    big = GemmRequest(_operand(17, 64, gen), _operand(64, 64, gen))
    assert not DecodeGemm.supports(big)
    with pytest.raises(KernelContractError):
        dg(big)


# ----------------------------------------------------------------------------- grouped (MoE decode)
def _offsets(counts: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(torch.tensor(counts).cumsum(0).tolist()), dtype=torch.int32)


def _grouped(dgx, counts, n, k, gen, *, limit=None, a_scale=1.0, layout="swizzled"):
    e, m = len(counts), sum(counts)
    a = _operand(m, k, gen, layout=layout)
    a = FP4Operand(a.packed, a.scales, a.global_scale * a_scale, k=k, scale_layout=layout)
    b = _operand(e * n, k, gen, layout=layout, groups=e)
    alphas = (a.global_scale * b.global_scale).float()
    got = dgx.grouped(GroupedGemmRequest(a, b, _offsets(counts).cuda(), alphas, swiglu_limit=limit))
    return got, a, b, alphas


@pytest.mark.parametrize("counts,n,k", [
    ([1], 256, 512), ([0, 0, 1, 0], 256, 512), ([0] * 100 + [1] + [0] * 283, 512, 1024),
    ([2, 0, 3, 1, 0, 9, 17, 1], 200, 1056), ([40, 1, 0, 130], 96, 320), ([5] * 24, 3072, 7168)])
def test_grouped_decode_gemm(dg, counts, n, k):
    gen = torch.Generator().manual_seed(len(counts) + n + k)
    got, a, b, alphas = _grouped(dg, counts, n, k, gen)
    assert got.shape == (sum(counts), n)
    _check_grouped(got, a, b, alphas, counts, k, f"grouped n{n} k{k}")


def _check_grouped(got, a, b, alphas, counts, k, label):
    """Every expert's rows against its own weights and alpha (``_check_gemm``'s bound)."""
    offs, ad = _offsets(counts).tolist(), _deq(a)
    for e in range(len(counts)):
        lo, hi = offs[e], offs[e + 1]
        if lo < hi:
            _check_gemm(got[lo:hi], ad[lo:hi], _deq(b, group=e, groups=len(counts)), alphas[e].double(), k,
                        f"{label} e{e}/{len(counts)} rows {hi - lo}")


@pytest.mark.parametrize("counts,n,k,limit", [([2, 0, 3, 1, 0, 9, 17, 1], 200, 1056, None), ([5] * 24, 3072, 7168, None),
                                               ([0, 4, 1, 0, 11], 2 * 136, 2048, 7.0)])
@pytest.mark.parametrize("copy16", [False, True])
def test_grouped_decode_gemm_copy_forms(counts, n, k, limit, copy16):
    """The grouped form with the weight rows copied in 16-byte chunks (the default) and by one bulk
    copy per row."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    gen = torch.Generator().manual_seed(len(counts) + n)
    got, a, b, alphas = _grouped(DecodeGemm("cuda", copy16=copy16), counts, n, k, gen, limit=limit,
                                 a_scale=4.0 if limit else 1.0)
    offs, ad = _offsets(counts).tolist(), _deq(a)
    for e in range(len(counts)):
        lo, hi = offs[e], offs[e + 1]
        if lo < hi:
            bd = _deq(b, group=e, groups=len(counts))
            if limit is None:
                _check_gemm(got[lo:hi], ad[lo:hi], bd, alphas[e].double(), k, f"copy16 grouped e{e}")
            else:
                _check_swiglu(got[lo:hi], ad[lo:hi], bd, alphas[e].double(), k, limit, f"copy16 grouped swiglu e{e}")


def test_grouped_decode_routing_6_of_384_swiglu(dg):
    """A decode step of 4 tokens, each routed to 6 of 384 experts, fused SwiGLU (w13)."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.stack([torch.randperm(384, generator=gen)[:6] for _ in range(4)]).flatten()
    counts = torch.bincount(ids, minlength=384).tolist()
    nh, k, limit = 256, 1024, 7.0
    got, a, b, alphas = _grouped(dg, counts, 2 * nh, k, gen, limit=limit, a_scale=4.0)
    offs, ad = _offsets(counts).tolist(), _deq(a)
    for e in set(ids.tolist()):
        lo, hi = offs[e], offs[e + 1]
        _check_swiglu(got[lo:hi], ad[lo:hi], _deq(b, group=e, groups=384), alphas[e].double(), k, limit,
                      f"grouped swiglu e{e}")


def test_grouped_decode_linear_scales_and_graph(dg):
    gen = torch.Generator().manual_seed(4)
    counts = [0, 3, 1, 0, 2]
    got, a, b, alphas = _grouped(dg, counts, 130, 544, gen, layout="linear")
    offs, ad = _offsets(counts).tolist(), _deq(a)
    for e in range(len(counts)):
        lo, hi = offs[e], offs[e + 1]
        if lo < hi:
            _check_gemm(got[lo:hi], ad[lo:hi], _deq(b, group=e, groups=len(counts)), alphas[e].double(), 544,
                        f"grouped linear e{e}")
    # CUDA-graph capture (no host reads) replays to the same bits
    req = GroupedGemmRequest(*_grouped_req_args(counts, 3072, 7168, gen))
    eager = dg.grouped(req)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dg.grouped(req)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = dg.grouped(req)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def _grouped_req_args(counts, n, k, gen):
    e, m = len(counts), sum(counts)
    a = _operand(m, k, gen)
    b = _operand(e * n, k, gen, groups=e)
    return a, b, _offsets(counts).cuda(), (a.global_scale * b.global_scale).float()


# ----------------------------------------------------------------------------- the backend's routing
@pytest.mark.parametrize("m,n,k,swiglu", [(1, 4096, 7168, False), (16, 6144, 7168, True), (4, 2048, 96, False),
                                          (1, 1536, 7168, False), (17, 4096, 1056, False)])
def test_backend_routes_decode_shapes(dg, m, n, k, swiglu):
    """``Sm90Backend.gemm`` hands the shapes ``use_decode_kernel`` names to the decode kernel (same bits as
    calling it directly) and the rest to the generic GEMM; either way within the accumulation bound."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend
    from dsv4.kernels.cutedsl.sm90.decode_route import use_decode_kernel

    gen = torch.Generator().manual_seed(m + n + k)
    a, b = _operand(m, k, gen), _operand(n, k, gen)
    limit = 7.0 if swiglu else None
    be = Sm90Backend("cuda")
    got = be.gemm(GemmRequest(a, b, swiglu_limit=limit))
    routed = use_decode_kernel(m, n, k)
    assert (be._decode_gemm is not None) == routed
    if routed:
        assert torch.equal(got, dg(GemmRequest(a, b, swiglu_limit=limit)))
    if swiglu:
        _check_swiglu(got, _deq(a), _deq(b), _alpha(a, b), k, limit, f"backend swiglu m{m} n{n}")
    else:
        _check_gemm(got, _deq(a), _deq(b), _alpha(a, b), k, f"backend m{m} n{n} k{k}")


@pytest.mark.parametrize("in_force", [False, True])
def test_backend_routes_decode_sized_grouped_calls(monkeypatch, in_force):
    """``Sm90Backend.grouped_gemm``: sparse routing (at most a row per expert on average) goes to the
    decode kernel, within the bound; 70 rows over 3 groups stay on the generic kernel."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend, decode_route

    monkeypatch.setattr(decode_route, "GROUPED_ROUTE", in_force)
    gen = torch.Generator().manual_seed(5)
    counts, n, k = [2, 0, 3, 1, 0, 9, 16, 1] + [0] * 32, 256, 1056   # 32 rows over 40 experts: sparse
    be = Sm90Backend("cuda")
    got, a, b, alphas = _grouped(SimpleNamespace(grouped=be.grouped_gemm), counts, n, k, gen)
    assert (be._decode_gemm is not None) == decode_route.GROUPED_ROUTE
    _check_grouped(got, a, b, alphas, counts, k, "backend grouped")
    big = Sm90Backend("cuda")
    _grouped(SimpleNamespace(grouped=big.grouped_gemm), [40, 0, 30], n, k, gen)
    assert big._decode_gemm is None
