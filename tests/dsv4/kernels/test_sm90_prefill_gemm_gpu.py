"""The sm_90a prefill route (``PrefillGemm``: exact FP4 -> BF16 dequantization + cuBLAS) on a Hopper GPU
(``gpu`` + ``sm90``; conftest skips them elsewhere).

The dequantization must equal ``e2m1 * e4m3`` bit for bit (NaN and -0 included). The GEMM is judged by
the analytic bound of the other sm_90a GEMM tests (``test_sm90_decode_gemm_gpu._check_gemm``, spec
nvfp4-and-kernels.md §6): both forms of the epilogue (cuBLAS scaling by the host-read alpha; FP32
output + torch epilogue inside a CUDA-graph capture and with the fused SwiGLU).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from dsv4.kernels.contract import ActQuantRequest, GemmRequest

sys.path.insert(0, str(Path(__file__).parent))   # the shared helpers beside this file
from sm90_gpu_operands import _deq, _operand  # noqa: E402
from test_sm90_decode_gemm_gpu import _check_gemm, _check_swiglu  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


@pytest.fixture(scope="module")
def pg():
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm

    return PrefillGemm("cuda")


def _replayed(pg, req: GemmRequest) -> torch.Tensor:
    """``pg(req)`` captured in a CUDA graph after one eager call (compiles and loads outside the capture),
    replayed once."""
    pg(req)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pg(req, validated=True)
    graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
@pytest.mark.parametrize("rows,k", [(1, 16), (300, 4112), (129, 7168)])
def test_dequant_is_e2m1_times_e4m3_bit_for_bit(pg, layout, rows, k):
    gen = torch.Generator().manual_seed(rows + k)
    op = _operand(rows, k, gen, layout=layout)
    if layout == "linear":  # a NaN block scale must come out NaN, the rest of the row untouched
        op.scales.view(torch.uint8)[0, 0] = 0x7F
    got = pg.dequant(op)
    ref = _deq(op)
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == (rows, k)
    assert torch.equal(got.double().isnan(), ref.isnan())
    fin = ~ref.isnan()
    assert torch.equal(got.double()[fin], ref[fin])
    assert torch.equal(torch.signbit(got.double()[fin]), torch.signbit(ref[fin]))  # -0 codes stay -0


@pytest.mark.parametrize("m,n,k", [(512, 1536, 7168), (64, 4096, 1024), (1000, 256, 4096)])
def test_prefill_gemm_within_the_accumulation_bound(pg, m, n, k):
    gen = torch.Generator().manual_seed(m * n)
    a, b = _operand(m, k, gen, layout="swizzled"), _operand(n, k, gen)
    got = pg(GemmRequest(a, b))
    alpha = (a.global_scale * b.global_scale).double()
    _check_gemm(got, _deq(a), _deq(b), alpha, k, f"prefill {m}x{n}x{k}")


def test_prefill_gemm_fused_swiglu_within_the_bound(pg):
    gen = torch.Generator().manual_seed(5)
    a, b = _operand(512, 4096, gen), _operand(2 * 2048, 4096, gen, layout="swizzled")
    got = pg(GemmRequest(a, b, swiglu_limit=10.0))
    assert tuple(got.shape) == (512, 2048)
    _check_swiglu(got, _deq(a), _deq(b), (a.global_scale * b.global_scale).double(), 4096, 10.0, "prefill swiglu")


def test_prefill_gemm_in_a_cuda_graph_matches_the_bound(pg):
    gen = torch.Generator().manual_seed(9)
    a, b = _operand(256, 2048, gen), _operand(1024, 2048, gen)
    out = _replayed(pg, GemmRequest(a, b))
    _check_gemm(out, _deq(a), _deq(b), (a.global_scale * b.global_scale).double(), 2048, "prefill in graph")


def test_prefill_gemm_in_l2_sized_column_blocks_matches_the_bound_in_a_graph():
    """With a (pretend) 1 MiB L2 a 256 x 1000 product is made in FP32 blocks of 384 columns (the last one
    232 wide); captured and replayed, every output element stays within the bound."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm, column_block

    assert column_block(256, 1000, 2**20) == 256   # 2**20 // 3 // (4 * 256) = 341 -> 256
    small = PrefillGemm("cuda", column_blocks=True, l2_bytes=3 * 4 * 256 * 384)
    assert column_block(256, 1000, small.l2_bytes) == 384
    gen = torch.Generator().manual_seed(11)
    a, b = _operand(256, 2048, gen), _operand(1000, 2048, gen, layout="swizzled")
    out = _replayed(small, GemmRequest(a, b))
    assert tuple(out.shape) == (256, 1000)
    _check_gemm(out, _deq(a), _deq(b), (a.global_scale * b.global_scale).double(), 2048, "prefill column blocks")


def test_prefill_swiglu_in_l2_sized_column_blocks_matches_the_bound_in_a_graph():
    """SwiGLU in blocks: 2 x 500 weight rows ([gate; up]) with blocks of 384 FP32 columns = 192 outputs
    each (the last 116 wide); captured and replayed, within the SwiGLU bound."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm

    small = PrefillGemm("cuda", column_blocks=True, l2_bytes=3 * 4 * 256 * 384)
    gen = torch.Generator().manual_seed(12)
    a, b = _operand(256, 2048, gen), _operand(2 * 500, 2048, gen, layout="swizzled")
    out = _replayed(small, GemmRequest(a, b, swiglu_limit=10.0))
    assert tuple(out.shape) == (256, 500)
    _check_swiglu(out, _deq(a), _deq(b), (a.global_scale * b.global_scale).double(), 2048, 10.0,
                  "prefill swiglu column blocks")


def test_prefill_epilogue_forms_agree_with_the_torch_epilogue(pg):
    """The epilogue kernel against torch's (``emulated._epilogue``): identical without SwiGLU (one FP32
    multiply, one BF16 rounding); with SwiGLU within one BF16 ulp (the generic kernel's exponential)."""
    from dsv4.kernels.emulated import _epilogue

    gen = torch.Generator().manual_seed(11)
    a, b = _operand(192, 64, gen), _operand(2 * 1024, 64, gen)
    y = torch.randn(192, 2 * 1024, generator=gen).mul_(8).cuda()
    alpha = a.global_scale * b.global_scale
    plain = pg.epilogue(y.clone(), GemmRequest(a, b))
    assert torch.equal(plain, _epilogue(y * alpha, None))
    sw = pg.epilogue(y.clone(), GemmRequest(a, b, swiglu_limit=7.0)).double()
    ref = _epilogue(y * alpha, 7.0).double()
    ulp = torch.exp2(torch.floor(torch.log2(ref.abs().clamp(min=2.0 ** -126))) - 7)
    assert bool(((sw - ref).abs() <= ulp).all())


def test_a_first_call_inside_a_capture_is_refused_with_a_clear_error(pg):  # pg: skips without cutlass
    from dsv4.kernels.contract import KernelContractError
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import PrefillGemm

    fresh = PrefillGemm("cuda")
    fresh._warm = False
    gen = torch.Generator().manual_seed(17)
    req = GemmRequest(_operand(64, 128, gen), _operand(256, 128, gen))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(KernelContractError, match="outside the capture"):
        with torch.cuda.graph(graph):
            fresh(req, validated=True)


def test_prefill_gemm_odd_output_width_takes_the_torch_epilogue_in_a_graph(pg):
    gen = torch.Generator().manual_seed(13)
    a, b = _operand(128, 256, gen), _operand(1030, 256, gen)
    out = _replayed(pg, GemmRequest(a, b))
    _check_gemm(out, _deq(a), _deq(b), (a.global_scale * b.global_scale).double(), 256, "prefill n=1030 in graph")


def test_backend_routes_prefill_sizes_when_in_force(monkeypatch, pg):
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend, backend, prefill_route

    monkeypatch.setattr(backend, "use_prefill_gemm", lambda m, n, k: m >= prefill_route.MIN_PREFILL_TOKENS)
    be = Sm90Backend("cuda")
    calls = []
    real = type(pg).__call__
    monkeypatch.setattr(type(pg), "__call__", lambda self, req, **kw: calls.append(req) or real(self, req, **kw))
    x = torch.randn(256, 2048, device="cuda", dtype=torch.bfloat16)
    aq = be.quantize_activation(ActQuantRequest(x, global_scale=torch.tensor(0.01, device="cuda")))
    w = _operand(512, 2048, torch.Generator().manual_seed(3))
    got = be.gemm(GemmRequest(aq, w))
    assert len(calls) == 1
    _check_gemm(got, _deq(aq), _deq(w), (aq.global_scale * w.global_scale).double(), 2048, "backend prefill route")
