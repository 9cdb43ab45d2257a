"""Routed MoE as a grouped GEMM vs a per-expert loop (incl. empty experts), SwiGLU clamp order,
routing-weight placement, shared expert, fault-injection friendliness of ``swiglu``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dsv4.layers.moe import MoE
from dsv4.layers.router import Router
from dsv4.layers.shared_expert import SharedExpert
from dsv4.layers.swiglu import clamped_swiglu
from dsv4.numerics import nvfp4_gemm_reference, nvfp4_quantize

from .helpers import cos, dispatcher, make_grouped, make_linear, rand

E, D, I, T, K, L = 6, 128, 128, 10, 2, 4.0


def _experts(seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    w1 = [rand(I, D, seed=seed + 10 * e + 1, scale=2.5 * D ** -0.5) for e in range(E)]
    w3 = [rand(I, D, seed=seed + 10 * e + 2, scale=2.5 * D ** -0.5) for e in range(E)]
    w2 = [rand(D, I, seed=seed + 10 * e + 3, scale=I ** -0.5) for e in range(E)]
    return w1, w3, w2


def _moe(fmt: str, disp=None) -> MoE:
    w1, w3, w2 = _experts()
    d = disp or dispatcher()
    gate = make_linear([rand(E, D, seed=99, scale=D ** -0.5)], "bf16", component="router", out_dtype=torch.float32)
    router = Router("layers.2.", gate, topk=K, route_scale=1.5, bias=None)
    w13 = make_grouped([[w1[e], w3[e]] for e in range(E)], fmt, name="w13", disp=d)
    w2g = make_grouped([[w2[e]] for e in range(E)], fmt, name="w2", disp=d)
    sh = SharedExpert("shared", make_linear([w1[0], w3[0]], fmt, component="shared_expert", disp=d),
                      make_linear([w2[0]], fmt, component="shared_expert", disp=d), swiglu_limit=L)
    return MoE("layers.2.", router, w13, w2g, sh, n_experts=E, swiglu_limit=L)


def _routing() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = rand(T, D, seed=7).to(torch.bfloat16)
    ids = torch.tensor([[0, 2], [2, 0], [5, 2], [0, 5]] * 2 + [[2, 5], [5, 0]])   # experts 1, 3, 4 empty
    w = torch.rand(T, K, generator=torch.Generator().manual_seed(8)) + 0.2
    return x, ids, w


def test_swiglu_clamps_raw_gate_and_up_before_silu():
    g = torch.tensor([20.0, -20.0, 5.0, 12.0])
    u = torch.tensor([20.0, -20.0, 0.5, -11.0])
    out = clamped_swiglu(g, u, 10.0)
    expect = torch.stack([F.silu(torch.tensor(10.0)) * 10, F.silu(torch.tensor(-20.0)) * -10,
                          F.silu(torch.tensor(5.0)) * 0.5, F.silu(torch.tensor(10.0)) * -10])
    torch.testing.assert_close(out, expect)
    wrong = torch.clamp(F.silu(g), max=10.0) * torch.clamp(u, -10, 10)   # clamp after SiLU
    assert not torch.allclose(out, wrong)


def test_bf16_grouped_moe_equals_per_expert_loop_with_empty_experts():
    moe = _moe("bf16")
    x, ids, w = _routing()
    w1, w3, w2 = _experts()
    bf = lambda t: t.to(torch.bfloat16).double()
    ref = torch.zeros(T, D, dtype=torch.float64)
    for t in range(T):
        for s in range(K):
            e = int(ids[t, s])
            g, u = bf(x[t].double() @ bf(w1[e]).T), bf(x[t].double() @ bf(w3[e]).T)   # w13 outputs BF16
            a = clamped_swiglu(g, u, L).double() * float(w[t, s])
            ref[t] += bf(a.to(torch.bfloat16).double() @ bf(w2[e]).T)   # w2 outputs BF16 rows
    out = moe.routed(x, ids, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    assert cos(out, ref) > 0.99999


def test_fp4_grouped_moe_equals_per_expert_oracle_loop():
    """The per-expert oracle: NVFP4 numerics functions, one activation global over all rows."""
    disp = dispatcher()
    moe = _moe("fp4", disp)
    x, ids, w = _routing()
    w1, w3, w2 = _experts()
    out = moe.routed(x, ids, w)
    gx = x.float().abs().max() / 2688.0
    rows = []
    for e in range(E):
        for t, s in (ids == e).nonzero().tolist():
            rows.append((e, t, s))
    a_rows = torch.stack([clamped_swiglu(*_fp4_gate_up(x[t], w1[e], w3[e], gx), L) for e, t, s in rows])
    a_rows = (a_rows.to(torch.bfloat16).float() * torch.tensor([float(w[t, s]) for e, t, s in rows])[:, None])
    a_rows = a_rows.to(torch.bfloat16)
    ga = a_rows.float().abs().max() / 2688.0
    ref = torch.zeros(T, D, dtype=torch.float64)
    for r, (e, t, s) in enumerate(rows):
        pa, sa, _ = nvfp4_quantize(a_rows[r:r + 1], ga)
        ref[t] += nvfp4_gemm_reference(pa, sa, ga, *nvfp4_quantize(w2[e]))[0].to(torch.bfloat16).double()
    torch.testing.assert_close(out.double(), ref, rtol=3e-2, atol=3e-2)
    assert cos(out, ref) > 0.9995
    assert disp.log.counts[("routed_experts", "emulated", "grouped_gemm")] == 2


def _fp4_gate_up(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, gx: torch.Tensor):
    px, sx, _ = nvfp4_quantize(x[None], gx)
    pw, sw, gw = nvfp4_quantize(torch.cat([w1, w3]))       # one global for the stacked [w1; w3]
    h = nvfp4_gemm_reference(px, sx, gx, pw, sw, gw)[0].float()
    return h[:I], h[I:]


def test_routing_weight_multiplies_the_swiglu_output_before_w2():
    """Scaling a routing weight by c scales that pair's contribution by c, through w2 (linear)."""
    moe = _moe("bf16")
    x, ids, w = _routing()
    base = moe.routed(x, ids, w)
    w2 = w.clone()
    w2[3, 1] *= 3.0
    diff = moe.routed(x, ids, w2) - base
    assert diff[[i for i in range(T) if i != 3]].abs().max() == 0
    only = moe.routed(x[3:4], ids[3:4], torch.tensor([[0.0, float(w[3, 1])]]))
    torch.testing.assert_close(diff[3], 2.0 * only[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("fmt", ["bf16", "fp4"])
def test_patched_swiglu_runs_even_where_the_epilogue_is_fused(fmt):
    moe = _moe(fmt)
    x, ids, w = _routing()
    assert moe.fused() == (fmt == "fp4")
    calls = []
    moe.swiglu = lambda g, u: calls.append(1) or torch.zeros_like(g)   # a fault: experts output nothing
    assert not moe.fused()
    assert moe.routed(x, ids, w).abs().max() == 0 and calls
    other = _moe(fmt)                                                # other instances are untouched
    assert other.fused() == (fmt == "fp4") and other.routed(x, ids, w).abs().max() > 0


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp4"])
def test_shared_expert_is_the_clamped_swiglu(fmt):
    w1, w3, w2 = _experts(seed=50)
    sh = SharedExpert("s", make_linear([w1[0], w3[0]], fmt), make_linear([w2[0]], fmt), swiglu_limit=L)
    x = rand(T, D, seed=9).to(torch.bfloat16)
    g, u = x.double() @ w1[0].double().T, x.double() @ w3[0].double().T
    assert (g.abs() > L).any() and (u.abs() > L).any()
    ref = clamped_swiglu(g, u, L).double() @ w2[0].double().T
    assert cos(sh(x), ref) > {"bf16": 0.9999, "fp8": 0.995, "fp4": 0.95}[fmt]
    unclamped = (F.silu(g) * u) @ w2[0].double().T
    assert cos(sh(x), unclamped) < cos(sh(x), ref) - 1e-3


def test_moe_call_emits_probes_and_sums_routed_and_shared():
    from dsv4.probes import ProbeRecorder
    moe = _moe("bf16")
    x, _, _ = _routing()
    with ProbeRecorder() as rec:
        out = moe(x, torch.zeros(T, dtype=torch.long))
    assert rec["layers.2.ffn.router.logits"].shape == (T, E)
    assert rec["layers.2.ffn.router.topk_ids"].dtype == torch.int64
    assert rec["layers.2.ffn.router.weights"].shape == (T, K)
    s = rec["layers.2.ffn.routed.out"] + rec["layers.2.ffn.shared.out"].float()
    torch.testing.assert_close(out, s.to(torch.bfloat16))
