"""The per-call audit against the oracle's analytic bound: clean calls from any correct accumulation
order pass with no violation; a single wrong element, code or scale is a violation naming its place."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest
from dsv4.kernels.emulated import EmulatedBackend
from dsv4.numerics import nvfp4_dequantize, nvfp4_quantize
from parity.audit.bounds import gamma, half_ulp_bf16
from parity.audit.calls import audit_gemm, audit_grouped, audit_quant

BE = EmulatedBackend()


def _weight(n: int, k: int, seed: int) -> FP4Operand:
    g = torch.Generator().manual_seed(seed)
    p, s, gs = nvfp4_quantize(torch.randn(n, k, generator=g))
    return FP4Operand(p, s, gs, k=k)


def _act(m: int, k: int, seed: int, rms: bool = False) -> tuple[ActQuantRequest, FP4Operand]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    w = torch.rand(k, generator=g) + 0.5 if rms else None
    req = ActQuantRequest(x, None, rms_weight=w)
    return req, BE.quantize_activation(req)


def _fp64_order(req: GemmRequest) -> torch.Tensor:
    """A correct kernel with another accumulation order: float64 sums, then FP32 alpha, BF16 out."""
    a = nvfp4_dequantize(req.a.packed, req.a.scales, 1.0).double()
    b = nvfp4_dequantize(req.b.packed, req.b.scales, 1.0).double()
    pre = (a @ b.T).float() * (req.a.global_scale * req.b.global_scale)
    if req.swiglu_limit is not None:
        n = pre.shape[1] // 2
        lim = req.swiglu_limit
        pre = torch.nn.functional.silu(pre[:, :n].clamp(max=lim)) * pre[:, n:].clamp(-lim, lim)
    return pre.to(torch.bfloat16)


def test_bound_helpers() -> None:
    assert gamma(1, 2.0 ** -23) == pytest.approx(2.0 ** -23, rel=1e-6)
    h = half_ulp_bf16(torch.tensor([1.0, 1.5, 2.0, 0.0, 3e-39]))
    assert h.tolist()[:4] == [2.0 ** -8, 2.0 ** -8, 2.0 ** -7, 0.0] and h[4] == 2.0 ** -134


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("swiglu", [None, 2.0])
@pytest.mark.parametrize("rms", [False, True])
def test_clean_gemm_from_two_accumulation_orders_has_no_violation(seed: int, swiglu: float | None, rms: bool) -> None:
    req_a, a = _act(9, 320, seed, rms)
    req = GemmRequest(a, _weight(96, 320, seed + 10), swiglu)
    for got in (BE.gemm(req), _fp64_order(req)):
        c = audit_gemm(req, got)
        assert c.violations == 0 and c.worst_ratio <= 1.0, c.examples
    assert audit_quant(req_a, a).violations == 0


def test_one_wrong_output_element_is_named() -> None:
    _, a = _act(5, 256, 3)
    req = GemmRequest(a, _weight(64, 256, 4))
    got = BE.gemm(req).clone()
    # a per-element bound: an element whose value cancels (small vs sum |a b|) is allowed more, so the
    # fault goes on a large one: 2 % of it is several bounds (half a BF16 ulp dominates there)
    m, n = divmod(int(got.float().abs().argmax()), got.shape[1])
    got[m, n] = got[m, n] * 1.02
    c = audit_gemm(req, got)
    assert c.violations == 1 and c.examples[0].where == f"out[m={m}, n={n}]" and c.examples[0].ratio > 4


def test_grouped_clean_and_faulty() -> None:
    req_a, a = _act(12, 128, 5)
    e, n = 3, 32
    w = _weight(e * n, 128, 6)
    b = FP4Operand(w.packed, w.scales, w.global_scale.repeat(e).contiguous() * torch.tensor([1.0, 0.5, 2.0]), k=128)
    offsets = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    req = GroupedGemmRequest(a, b, offsets, a.global_scale * b.global_scale, 2.0)
    got = BE.grouped_gemm(req)
    assert audit_grouped(req, got).violations == 0
    bad = got.clone()
    bad[7] = 0            # a row of expert 2 never written
    c = audit_grouped(req, bad)
    assert c.violations > 0 and c.examples[0].where.startswith("out(expert 2, rows 5..11)[m=2,")


@pytest.mark.parametrize("batch", [1, 2 * 32 * 128, 2**27])   # one expert a batch .. every expert in one
def test_grouped_batched_replay_records_what_the_per_expert_judgement_records(monkeypatch, batch: int) -> None:
    import parity.audit.calls as calls

    _, a = _act(14, 128, 8)
    e, n = 5, 32
    w = _weight(e * n, 128, 9)
    b = FP4Operand(w.packed, w.scales, w.global_scale.repeat(e).contiguous() * torch.tensor([1.0, 0.5, 2.0, 1.0, 4.0]), k=128)
    offsets = torch.tensor([0, 0, 6, 7, 14, 14], dtype=torch.int32)   # empty experts first, inside, last
    req = GroupedGemmRequest(a, b, offsets, a.global_scale * b.global_scale, 2.0)
    got = _fp64_grouped(req)
    monkeypatch.setattr(calls, "BATCH_ELEMENTS", batch)
    fast = audit_grouped(req, got)
    monkeypatch.setattr(calls, "_grouped_batched_clean", lambda *args: False)
    slow = audit_grouped(req, got)
    assert fast.violations == slow.violations == 0
    assert fast.elements == slow.elements == 14 * n // 2
    assert fast.worst_ratio == pytest.approx(slow.worst_ratio, rel=1e-5) and 0 < fast.worst_ratio <= 1


def _fp64_grouped(req: GroupedGemmRequest) -> torch.Tensor:
    """A correct grouped kernel with another accumulation order (float64 sums per expert)."""
    n, offs = req.n_per_expert, req.offsets.tolist()
    outs = []
    for e in range(req.num_experts):
        b = FP4Operand(req.b.packed[e * n:(e + 1) * n], req.b.scales[e * n:(e + 1) * n], req.alphas[e] / req.a.global_scale,
                       k=req.a.k)
        a = FP4Operand(req.a.packed[offs[e]:offs[e + 1]], req.a.scales[offs[e]:offs[e + 1]], req.a.global_scale, k=req.a.k)
        if offs[e + 1] > offs[e]:
            outs.append(_fp64_order(GemmRequest(a, b, req.swiglu_limit)))
    return torch.cat(outs)


def test_quant_code_scale_and_global_faults_are_violations() -> None:
    req, a = _act(4, 64, 7)
    codes = a.packed.clone()
    codes[1, 3] ^= 0x01                       # one nibble (element 6 of row 1) off by one code
    c = audit_quant(req, FP4Operand(codes, a.scales, a.global_scale, k=64))
    assert c.violations == 1 and c.examples[0].where == "codes[row 1, k 6]"
    sc = a.scales.view(torch.uint8).clone()
    sc[2, 1] += 1                              # one block scale one code too large
    c = audit_quant(req, FP4Operand(a.packed, sc.view(torch.float8_e4m3fn), a.global_scale, k=64))
    assert c.examples[0].where == "scales[row 2, block 1]"
    c = audit_quant(req, FP4Operand(a.packed, a.scales, a.global_scale * 1.5, k=64))
    assert c.examples[0].where == "global_scale[0]"


def test_fused_rmsnorm_allows_only_boundary_near_flips() -> None:
    """A kernel normalizing in float64 may flip a code only where the oracle's pre-rounding value is
    within the RMSNorm bound of a rounding boundary: the interval check accepts it, a far flip fails."""
    req, a = _act(16, 512, 8, rms=True)
    x = req.x.double()
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + req.rms_eps) * req.rms_weight.double()).float()
    p, s, g = nvfp4_quantize(y)
    assert audit_quant(req, FP4Operand(p, s, g, k=512)).violations == 0
    far = p.clone()
    far[0, 0] ^= 0x03
    assert audit_quant(req, FP4Operand(far, s, g, k=512)).violations >= 1


def test_a_one_ulp_global_scale_is_one_violation_named_in_ulps() -> None:
    """The kernel's runtime global scale one FP32 ulp off the oracle's: one violation (its block scales
    and codes are judged on its own scale), described by its distance, not as infinitely many bounds."""
    from parity.audit.auditor import Violation

    req, a = _act(4, 64, 7)
    g_off = torch.nextafter(a.global_scale, torch.tensor(1.0))
    p, s, _ = nvfp4_quantize(req.x.float(), g_off)   # a consistent kernel around that scale
    c = audit_quant(req, FP4Operand(p, s, g_off, k=64))
    assert c.violations == 1 and c.examples[0].where == "global_scale[0]"
    assert c.examples[0].ulps == 1 and "1 FP32 ulp apart; exact match required" in c.examples[0].describe()
    assert c.worst() == "an exact element 1 FP32 ulps off"
    v = Violation("layers.0.attn.wo_a", "attn_o", "quantize_activation", 0, "x", "p", c)
    assert "3.4e+38" not in v.describe() and "inf" not in v.describe()
    assert v.summary()["examples"][0]["ulps"] == 1


def test_a_summary_with_infinite_ratios_is_written_as_standard_json(tmp_path) -> None:
    import json

    from parity.records import atomic_write_json

    atomic_write_json(tmp_path / "s.json", {"worst_ratio": float("inf"), "rows": [float("-inf"), float("nan"), 1.5]})
    got = json.loads((tmp_path / "s.json").read_text())
    assert got == {"worst_ratio": "inf", "rows": ["-inf", "nan", 1.5]}


@pytest.mark.gpu
def test_calls_on_the_gpu_are_replayed_there() -> None:
    """Static-scale activations (routed experts) and grouped calls on CUDA: judged on CUDA, no
    cross-device error, no violation from the emulated backend."""
    be = EmulatedBackend()
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 64, generator=g) * 2).to(torch.bfloat16).cuda()
    req = ActQuantRequest(x, torch.tensor(0.004, device="cuda"))
    assert audit_quant(req, be.quantize_activation(req)).violations == 0
    req = ActQuantRequest(x, None)
    assert audit_quant(req, be.quantize_activation(req)).violations == 0


@pytest.mark.parametrize("rms", [False, True])
def test_bit_identical_quant_takes_the_short_path_with_the_same_count(monkeypatch, rms: bool) -> None:
    """A clean call judged by the one-read byte comparison (with or without a fused norm) counts the
    elements the step-by-step judgement counts; a -0 code where the oracle has +0 leaves the short path
    and is no violation."""
    import parity.audit.calls as calls

    req, a = _act(4, 64, 11, rms=rms)
    taken = []
    real = calls._bit_identical
    monkeypatch.setattr(calls, "_bit_identical", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    fast = audit_quant(req, a)
    assert taken == [True]
    monkeypatch.setattr(calls, "_bit_identical", lambda *a, **k: False)
    slow = audit_quant(req, a)
    assert fast.passed and slow.passed and fast.elements == slow.elements == 1 + 4 * 4 + 4 * 64
    monkeypatch.undo()
    codes = a.packed.clone()
    zero = (codes & 0x0F) == 0
    assert bool(zero.any())
    codes[zero] |= 0x08                         # +0 low nibbles written as -0: equal values
    c = audit_quant(req, FP4Operand(codes, a.scales, a.global_scale, k=64))
    assert c.passed and c.elements == fast.elements


def test_a_weight_changed_in_place_is_decoded_again() -> None:
    w = _weight(16, 64, 3)
    req_a, a = _act(2, 64, 4)
    req = GemmRequest(a, w)
    before = BE.gemm(req)
    assert audit_gemm(req, before).passed
    w.packed[0, :] ^= 0x77                      # row 0 changes: the oracle (and the backend) see the new bytes
    assert not audit_gemm(req, before).passed
    assert audit_gemm(req, _fp64_order(req)).passed and audit_gemm(req, BE.gemm(req)).passed


def test_the_one_read_path_records_a_clean_comparison_as_the_full_judgement_does(monkeypatch) -> None:
    """parity.audit.calls._clean: on clean data the same elements and worst ratio as the element-wise
    judgement (bounds down to subnormals, where the ratio's clamp matters); an error one FP32 step
    above its bound still goes to the judgement and is caught."""
    import torch

    from parity.audit import calls

    g = torch.Generator().manual_seed(3)
    e = torch.randn(64, 48, generator=g)
    b = torch.rand(64, 48, generator=g) * 1e-3 + torch.tensor(1e-40)   # some bounds subnormal
    got = e + (torch.rand(64, 48, generator=g) * 2 - 1) * b

    def judged(fast: bool) -> calls.CallCheck:
        if not fast:
            monkeypatch.setattr(calls, "_clean", lambda *a: False)
        check = calls.CallCheck("gemm")
        calls._compare(check, ["out", "m=", "n="], e, got, b)
        monkeypatch.undo()
        return check

    fast, full = judged(True), judged(False)
    assert (fast.elements, fast.violations, fast.worst_ratio) == (full.elements, full.violations, full.worst_ratio)
    assert fast.violations == 0 and 0 < fast.worst_ratio <= 1

    bound = torch.tensor([2.0 - 2.0 ** -23], dtype=torch.float32)
    err = torch.nextafter(bound, torch.tensor([4.0]))      # one FP32 step above the bound
    check = calls.CallCheck("gemm")
    calls._compare(check, ["out"], torch.zeros(1), err, bound)
    assert check.violations == 1


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
def test_grouped_bank_decoded_per_expert_judges_as_the_whole_bank(monkeypatch, layout: str) -> None:
    """A bank too big to decode whole (Pro's 384 x 6144 x 7168 is 63 GiB in FP32) is decoded per routed
    expert: the same records, clean and faulty, as the whole decoded bank, in both scale layouts."""
    import parity.audit.calls as calls
    from dsv4.numerics import swizzle_scales

    _, a = _act(14, 128, 8)
    e, n = 5, 32
    w = _weight(e * n, 128, 9)
    scales = w.scales
    if layout == "swizzled":
        scales = torch.cat([swizzle_scales(w.scales[i * n:(i + 1) * n]) for i in range(e)])
    b = FP4Operand(w.packed, scales, w.global_scale.repeat(e).contiguous() * torch.tensor([1.0, 0.5, 2.0, 1.0, 4.0]),
                   k=128, scale_layout=layout)
    offsets = torch.tensor([0, 0, 6, 7, 14, 14], dtype=torch.int32)
    req = GroupedGemmRequest(a, b, offsets, a.global_scale * b.global_scale, 2.0)
    got = BE.grouped_gemm(req)
    bad = got.clone()
    bad[6] = bad[6] * 1.5     # expert 2's only row
    whole = [audit_grouped(req, g) for g in (got, bad)]
    monkeypatch.setattr(calls, "BANK_CACHE_ELEMENTS", 0)
    monkeypatch.setattr(calls, "_weight", lambda *a, **k: pytest.fail("the whole bank was decoded"))
    for batch in (1, 2**27):
        monkeypatch.setattr(calls, "BATCH_ELEMENTS", batch)
        per = [audit_grouped(req, g) for g in (got, bad)]
        assert per[0].violations == whole[0].violations == 0 and per[0].elements == whole[0].elements == 14 * n // 2
        assert per[0].worst_ratio == pytest.approx(whole[0].worst_ratio, rel=1e-6)
        assert per[1].violations == whole[1].violations > 0
        assert [x.where for x in per[1].examples] == [x.where for x in whole[1].examples]
        assert per[1].examples[0].where.startswith("out(expert 2, rows 6..6)")
