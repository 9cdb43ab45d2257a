"""The emulated backend against the float64 oracle (dsv4.numerics), and contract enforcement.

Tolerance used throughout, stated once: the emulation's only roundings are the FP32 accumulation
(error <= K * 2^-24 * sum|a*b|, Higham's gamma_K), the FP32 alpha product and multiply (2 * 2^-24
relative) and the BF16 output cast (1/2 BF16 ulp). We allow 1 BF16 ulp of the reference plus the FP32
terms: an FP32 error can push a value across a BF16 rounding boundary, so the result may be the
neighbour of the correctly rounded one, never further.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dsv4.kernels.emulated as emulated
from dsv4.kernels.contract import (ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest,
                                   KernelContractError)
from dsv4.kernels.emulated import EmulatedBackend
from dsv4.kernels.registry import get_backend
from dsv4.numerics import (nvfp4_dequantize, nvfp4_gemm_reference, nvfp4_quantize, swizzle_scales,
                           unswizzle_scales)

U32 = 2.0 ** -24


def operand(rows: int, k: int, seed: int, *, scale: float = 1.0, layout: str = "linear") -> FP4Operand:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) * scale
    p, s, g = nvfp4_quantize(x)
    return FP4Operand(p, swizzle_scales(s) if layout == "swizzled" else s, g, k, layout)


def linear_scales(op: FP4Operand) -> torch.Tensor:
    return op.scales if op.scale_layout == "linear" else unswizzle_scales(op.scales, op.rows, op.k // 16)


def block_values(op: FP4Operand) -> torch.Tensor:
    return nvfp4_dequantize(op.packed, linear_scales(op), 1.0).double()


def bf16_ulp(y: torch.Tensor) -> torch.Tensor:
    """Spacing of BF16 numbers at |y| (8 significant bits)."""
    e = torch.floor(torch.log2(y.abs().clamp(min=2.0 ** -126)))
    return torch.exp2(e - 7)


def fp32_err(a: FP4Operand, b: FP4Operand, alpha: torch.Tensor | float) -> torch.Tensor:
    """Bound on the FP32 accumulation + alpha rounding error, per output."""
    abs_sum = block_values(a).abs() @ block_values(b).abs().T * float(alpha)
    return (a.k * U32 + 4 * U32) * abs_sum


def ref_gemm(a: FP4Operand, b: FP4Operand) -> torch.Tensor:
    return nvfp4_gemm_reference(a.packed, linear_scales(a), a.global_scale, b.packed, linear_scales(b), b.global_scale)


def swiglu64(y: torch.Tensor, limit: float) -> torch.Tensor:
    n = y.shape[-1] // 2
    gate, up = y[..., :n].clamp(max=limit), y[..., n:].clamp(-limit, limit)
    return F.silu(gate) * up


def swiglu_tol(y: torch.Tensor, err: torch.Tensor, limit: float) -> torch.Tensor:
    """Propagate the GEMM error through silu(min(g, L)) * clamp(u) (silu' <= 1.1), plus FP32
    rounding of the epilogue (a few ulps) and 1 BF16 ulp of the output."""
    n = y.shape[-1] // 2
    gate, up = y[..., :n].clamp(max=limit), y[..., n:].clamp(-limit, limit)
    eg, eu = err[..., :n], err[..., n:]
    out = F.silu(gate) * up
    return 1.1 * eg * (up.abs() + eu) + (F.silu(gate).abs() + 1.1 * eg) * eu + 8 * U32 * out.abs() + bf16_ulp(out)


# ---------------------------------------------------------------- dense GEMM


@pytest.mark.parametrize("m,n,k", [(1, 16, 16), (7, 48, 80), (130, 33, 512)])
@pytest.mark.parametrize("layouts", [("linear", "linear"), ("swizzled", "swizzled"), ("linear", "swizzled")])
def test_gemm_matches_the_float64_oracle(m: int, n: int, k: int, layouts: tuple[str, str]) -> None:
    a = operand(m, k, 1, layout=layouts[0])
    b = operand(n, k, 2, scale=0.05, layout=layouts[1])
    y = EmulatedBackend().gemm(GemmRequest(a, b))
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    ref = ref_gemm(a, b)
    tol = bf16_ulp(ref) + fp32_err(a, b, a.global_scale * b.global_scale)
    assert ((y.double() - ref).abs() <= tol).all()
    # most outputs are the correctly rounded value itself (spec §6 measured 100 % on its model)
    assert (y == ref.float().to(torch.bfloat16)).double().mean() >= 0.99


def test_alpha_is_applied_after_the_product_in_fp32() -> None:
    # Global scales far from 1 (2^-20 and 3e4): folding them into BF16 operands would cost ~2e-4
    # relative error; applied after the FP32 product the result stays within the tolerance.
    a = operand(9, 128, 3, scale=2.0 ** -20 * 2688)
    b = operand(12, 128, 4, scale=3e4 * 2688)
    y = EmulatedBackend().gemm(GemmRequest(a, b))
    ref = ref_gemm(a, b)
    assert ((y.double() - ref).abs() <= bf16_ulp(ref) + fp32_err(a, b, a.global_scale * b.global_scale)).all()


def test_gemm_with_swiglu_epilogue_clamps_the_gate_before_the_sigmoid() -> None:
    a = operand(20, 64, 5)
    b = operand(2 * 24, 64, 6, scale=0.3)  # rows [gate (24); up (24)]
    ref = ref_gemm(a, b)
    limit = float(ref.abs().quantile(0.6))  # many gates and ups beyond the limit: the clamps matter
    assert (ref[:, :24] > limit).any() and (ref[:, 24:].abs() > limit).any()
    y = EmulatedBackend().gemm(GemmRequest(a, b, swiglu_limit=limit))
    assert y.shape == (20, 24) and y.dtype == torch.bfloat16
    tol = swiglu_tol(ref, fp32_err(a, b, a.global_scale * b.global_scale), limit)
    assert ((y.double() - swiglu64(ref, limit)).abs() <= tol).all()
    # the tolerance is tight enough to tell the documented epilogue from a sigmoid of the raw gate
    gate, up = ref[:, :24], ref[:, 24:].clamp(-limit, limit)
    wrong = gate.clamp(max=limit) * torch.sigmoid(gate) * up
    assert ((y.double() - wrong).abs() > tol).any()


# ---------------------------------------------------------------- grouped GEMM


def expert_stack(e_count: int, n: int, k: int, layout: str) -> FP4Operand:
    """E expert matrices quantized one by one (own global scale each), stacked; swizzled per expert."""
    ps, ss, gs = [], [], []
    for e in range(e_count):
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(100 + e)) * (0.01 * (e + 1))
        p, s, g = nvfp4_quantize(w)
        ps.append(p)
        ss.append(swizzle_scales(s) if layout == "swizzled" else s)
        gs.append(g)
    return FP4Operand(torch.cat(ps), torch.cat(ss), torch.stack(gs), k, layout)


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
@pytest.mark.parametrize("swiglu", [None, 0.02])
def test_grouped_gemm_matches_per_expert_oracle(layout: str, swiglu: float | None) -> None:
    counts = [3, 0, 5, 1, 0]  # empty experts included, also at the end
    e_count, n, k = len(counts), 32, 96
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    a = operand(sum(counts), k, 7)
    b = expert_stack(e_count, n, k, layout)
    alphas = (a.global_scale * b.global_scale).to(torch.float32)
    y = EmulatedBackend().grouped_gemm(GroupedGemmRequest(a, b, offsets, alphas, swiglu_limit=swiglu))
    assert y.shape == (sum(counts), n // 2 if swiglu else n) and y.dtype == torch.bfloat16
    for e in range(e_count):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if lo == hi:
            continue
        s_e = b.scales[e * n:(e + 1) * n] if layout == "linear" else b.scales.reshape(e_count, -1)[e]
        be = FP4Operand(b.packed[e * n:(e + 1) * n], s_e, b.global_scale[e], k, layout)
        ae = FP4Operand(a.packed[lo:hi], a.scales[lo:hi], a.global_scale, k, "linear")
        ref, err = ref_gemm(ae, be), fp32_err(ae, be, alphas[e])
        if swiglu is None:
            ok = (y[lo:hi].double() - ref).abs() <= bf16_ulp(ref) + err
        else:
            ok = (y[lo:hi].double() - swiglu64(ref, swiglu)).abs() <= swiglu_tol(ref, err, swiglu)
        assert ok.all(), f"expert {e}"


def test_grouped_gemm_uses_each_experts_alpha() -> None:
    # Same weights for both experts, global scales (hence alphas) differing by 2x: outputs differ by 2x.
    k, n = 64, 16
    a = operand(4, k, 8)
    w = operand(n, k, 9)
    b = FP4Operand(torch.cat([w.packed, w.packed]), torch.cat([w.scales, w.scales]),
                   torch.stack([w.global_scale, 2 * w.global_scale]), k)
    offsets = torch.tensor([0, 2, 4], dtype=torch.int32)
    aa = torch.cat([a.packed[:2], a.packed[:2]])
    sa = torch.cat([a.scales[:2], a.scales[:2]])
    a2 = FP4Operand(aa, sa, a.global_scale, k)
    alphas = a.global_scale * b.global_scale
    y = EmulatedBackend().grouped_gemm(GroupedGemmRequest(a2, b, offsets, alphas))
    assert torch.equal(y[2:].float(), 2 * y[:2].float())
    with pytest.raises(KernelContractError, match="alphas"):   # alphas disagreeing with the scales
        GroupedGemmRequest(a2, b, offsets, alphas * torch.tensor([1.0, 0.5])).validate()


# ---------------------------------------------------------------- activation quantization


@pytest.mark.parametrize("recipe", ["exact", "rcp"])
@pytest.mark.parametrize("layout", ["linear", "swizzled"])
def test_quantize_activation_is_the_oracle_quantizer(recipe: str, layout: str) -> None:
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    for g in (None, torch.tensor(0.004)):
        op = EmulatedBackend().quantize_activation(ActQuantRequest(x, global_scale=g, scale_layout=layout,
                                                                   recipe=recipe))
        op.validate("x")  # what it returns satisfies the contract it is checked against
        p, s, gg = nvfp4_quantize(x, g, recipe=recipe)
        assert torch.equal(op.packed, p) and torch.equal(op.global_scale, gg)
        assert op.scale_layout == layout and op.k == 96
        assert torch.equal(linear_scales(op).view(torch.uint8), s.view(torch.uint8))


def test_quantize_activation_with_fused_rmsnorm() -> None:
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(6, 128, generator=gen) * 3).to(torch.bfloat16)
    w = (torch.rand(128, generator=gen) + 0.5).to(torch.bfloat16)
    op = EmulatedBackend().quantize_activation(ActQuantRequest(x, rms_weight=w, rms_eps=1e-6))
    # definition: FP32 RMSNorm, then the runtime-amax quantizer on the FP32 result
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    p, s, g = nvfp4_quantize(normed)
    assert torch.equal(op.packed, p) and torch.equal(op.scales.view(torch.uint8), s.view(torch.uint8))
    # and it really is an RMSNorm with the weight: dequantized values track the float64 norm
    x64 = x.double()
    want = x64 / x64.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w.double()
    deq = nvfp4_dequantize(op.packed, op.scales, op.global_scale).double()
    blk_amax = want.abs().reshape(6, 8, 16).amax(-1).repeat_interleave(16, -1)
    assert ((deq - want).abs() <= blk_amax / 6 * 1.07 + 1e-6).all()  # <= one grid step of the block


# ---------------------------------------------------------------- contract enforcement


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any computation fail loudly, so a contract error proves validation ran first."""
    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("compute reached before validation")
    monkeypatch.setattr(emulated, "_block_dequant", boom)
    monkeypatch.setattr(emulated, "nvfp4_quantize", boom)


def _bad_gemms() -> list[GemmRequest]:
    a, b = operand(4, 32, 1), operand(6, 32, 2)
    b64 = operand(6, 64, 2)
    return [
        GemmRequest(FP4Operand(a.packed.view(torch.int8), a.scales, a.global_scale, 32), b),
        GemmRequest(a, b64),  # K mismatch
        GemmRequest(a, FP4Operand(b.packed, b.scales.reshape(-1), b.global_scale, 32, "swizzled")),
        GemmRequest(FP4Operand(a.packed, a.scales, a.global_scale.double(), 32), b),
        GemmRequest(a, operand(5, 32, 3), swiglu_limit=7.0),  # odd [gate; up] rows
        GemmRequest(a, b, swiglu_limit=-1.0),
        GemmRequest(FP4Operand(a.packed, a.scales, a.global_scale, 48), b),  # k vs packed width
    ]


@pytest.mark.parametrize("req", _bad_gemms())
def test_gemm_contract_violations_raise_before_compute(req: GemmRequest, no_compute: None) -> None:
    with pytest.raises(KernelContractError):
        EmulatedBackend().gemm(req)


def _bad_grouped() -> list[GroupedGemmRequest]:
    a, b = operand(5, 32, 1), expert_stack(2, 16, 32, "linear")
    al = (a.global_scale * b.global_scale).float()
    ok_off = torch.tensor([0, 2, 5], dtype=torch.int32)
    return [
        GroupedGemmRequest(a, b, torch.tensor([0, 3, 2], dtype=torch.int32), al),  # decreasing
        GroupedGemmRequest(a, b, torch.tensor([0, 2, 4], dtype=torch.int32), al),  # does not end at rows
        GroupedGemmRequest(a, b, ok_off.long(), al),
        GroupedGemmRequest(a, b, ok_off, al[:1]),
        GroupedGemmRequest(a, FP4Operand(b.packed, b.scales, b.global_scale[0], 32), ok_off, al),
        GroupedGemmRequest(a, FP4Operand(b.packed, swizzle_scales(b.scales).reshape(-1), b.global_scale, 32,
                                         "swizzled"), ok_off, al),  # swizzled as one matrix, not per expert
    ]


@pytest.mark.parametrize("req", _bad_grouped())
def test_grouped_contract_violations_raise_before_compute(req: GroupedGemmRequest, no_compute: None) -> None:
    with pytest.raises(KernelContractError):
        EmulatedBackend().grouped_gemm(req)


@pytest.mark.parametrize("req", [
    ActQuantRequest(torch.randn(2, 32)),  # float32, not bf16
    ActQuantRequest(torch.randn(2, 24).to(torch.bfloat16)),
    ActQuantRequest(torch.randn(2, 32).to(torch.bfloat16), recipe="fast"),
    ActQuantRequest(torch.randn(2, 32).to(torch.bfloat16), global_scale=torch.tensor(0.0)),
    ActQuantRequest(torch.randn(2, 32).to(torch.bfloat16), global_scale=torch.tensor(float("nan"))),
    ActQuantRequest(torch.randn(2, 32).to(torch.bfloat16), rms_weight=torch.ones(16)),
])
def test_act_quant_contract_violations_raise_before_compute(req: ActQuantRequest, no_compute: None) -> None:
    with pytest.raises(KernelContractError):
        EmulatedBackend().quantize_activation(req)


# ---------------------------------------------------------------- registry, devices


def test_registered_as_emulated() -> None:
    be = get_backend("emulated", "cpu")
    assert isinstance(be, EmulatedBackend) and be.name == "emulated"


def test_a_shared_backend_is_one_instance_per_device_and_never_auto() -> None:
    from dsv4.kernels.registry import register_shared_backend, resolve_backend, unregister_backend

    name = register_shared_backend("emulated")
    try:
        assert name == "emulated_shared" and register_shared_backend("emulated") == name
        assert get_backend(name, "cpu") is get_backend(name, "cpu")
        assert get_backend("emulated", "cpu") is not get_backend("emulated", "cpu")
        assert resolve_backend("auto", "cpu").name == "emulated"
    finally:
        unregister_backend(name)


@pytest.mark.gpu
def test_cuda_results_match_cpu(device: str) -> None:
    a, b = operand(33, 256, 1), operand(40, 256, 2, scale=0.1)
    mv = lambda o: FP4Operand(o.packed.to(device), o.scales.to(device), o.global_scale.to(device), o.k)  # noqa: E731
    be = EmulatedBackend()
    y_cpu, y_dev = be.gemm(GemmRequest(a, b)), be.gemm(GemmRequest(mv(a), mv(b))).cpu()
    ref = ref_gemm(a, b)
    assert ((y_dev.double() - ref).abs() <= bf16_ulp(ref) + fp32_err(a, b, a.global_scale * b.global_scale)).all()
    assert (y_dev != y_cpu).double().mean() <= 0.01  # only FP32 accumulation order differs
    x = torch.randn(8, 256).to(torch.bfloat16)
    for recipe in ("exact", "rcp"):
        op_c = be.quantize_activation(ActQuantRequest(x, recipe=recipe))
        op_d = be.quantize_activation(ActQuantRequest(x.to(device), recipe=recipe))
        assert torch.equal(op_d.packed.cpu(), op_c.packed)  # the quantizer is bit-exact across devices
        assert torch.equal(op_d.scales.cpu().view(torch.uint8), op_c.scales.view(torch.uint8))


def test_auto_never_picks_a_negative_priority_backend() -> None:
    from dsv4.kernels.emulated import EmulatedBackend
    from dsv4.kernels.registry import register_backend, resolve_backend, unregister_backend

    register_backend("by-name-only", lambda d: EmulatedBackend(), supports=lambda d: True, priority=-1)
    try:
        assert resolve_backend("by-name-only", "cpu").name == "by-name-only"
        with pytest.raises(Exception, match="no backend supports"):   # the only other CPU backends excluded
            resolve_backend("auto", "cpu", exclude=("emulated", "tiled_gemm"))
    finally:
        unregister_backend("by-name-only")
