"""Linear per format against the numerics oracle / plain torch on the same inputs."""
from __future__ import annotations

import pytest
import torch

from dsv4.layers.norm import RMSNorm, rms_normalize
from dsv4.layers.swiglu import clamped_swiglu
from dsv4.numerics import (fp8_act_dequantize, fp8_act_quantize, fp8_block_dequantize, fp8_block_quantize,
                           nvfp4_gemm_reference, nvfp4_quantize)

from .helpers import cos, dispatcher, make_linear, rand

N, K, M = 96, 256, 12
BF16_REL = 2.0 ** -7   # <= 1 BF16 ulp of the output (spec nvfp4-and-kernels.md §6 (a))


@pytest.fixture(scope="module")
def xw() -> tuple[torch.Tensor, torch.Tensor]:
    return rand(M, K, seed=1).to(torch.bfloat16), rand(N, K, seed=2, scale=K ** -0.5)


def test_bf16_is_bf16_operands_fp32_accumulation(xw):
    x, w = xw
    y = make_linear([w], "bf16")(x)
    ref = x.double() @ w.to(torch.bfloat16).double().T
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), ref, rtol=BF16_REL, atol=1e-6)


def test_fp8_matches_block_fp8_oracle(xw):
    x, w = xw
    y = make_linear([w], "fp8")(x)
    xq = fp8_act_dequantize(*fp8_act_quantize(x, 128)).double()
    wq = fp8_block_dequantize(*fp8_block_quantize(w)).double()
    torch.testing.assert_close(y.double(), xq @ wq.T, rtol=BF16_REL, atol=1e-6)
    exact = x.double() @ w.double().T
    assert 0.99 < cos(y, exact) < 0.99999   # quantized, but not by much


def test_fp4_matches_nvfp4_gemm_reference(xw):
    x, w = xw
    lin = make_linear([w], "fp4")
    y = lin(x)
    pw, sw, gw = nvfp4_quantize(w)
    px, sx, gx = nvfp4_quantize(x)          # runtime global scale: no input_scale on a converted weight
    ref = nvfp4_gemm_reference(px, sx, gx, pw, sw, gw)
    torch.testing.assert_close(y.double(), ref, rtol=BF16_REL, atol=1e-5)
    assert 0.95 < cos(y, x.double() @ w.double().T) < 0.9999   # W4A4 noise is visible


def test_fp4_fused_rmsnorm_quantizes_the_fp32_normalized_rows(xw):
    x, w = xw
    norm = RMSNorm(rand(K, seed=3).abs() + 0.5, 1e-6)
    y = make_linear([w], "fp4")(norm.defer(x))
    px, sx, gx = nvfp4_quantize(rms_normalize(x, norm.weight, 1e-6))
    ref = nvfp4_gemm_reference(px, sx, gx, *nvfp4_quantize(w))
    torch.testing.assert_close(y.double(), ref, rtol=BF16_REL, atol=1e-5)


def test_fp4_act_scale_policies(xw):
    x, w = xw
    static = torch.tensor(0.05, dtype=torch.float32)
    lin = make_linear([w], "fp4")
    lin.weight.input_scale = static
    assert float(lin.quantize_input(x).global_scale) == float(static)
    lin.act_scale = "runtime"
    assert float(lin.quantize_input(x).global_scale) == pytest.approx(float(x.float().abs().max()) / 2688.0)
    fro = make_linear([w], "fp4", act_scale="frozen")
    g1 = float(fro.quantize_input(x).global_scale)
    g2 = float(fro.quantize_input(x * 4).global_scale)
    assert g1 == g2 == pytest.approx(float(x.float().abs().max()) / 2688.0)


def test_fp4_fused_swiglu_epilogue_equals_unfused(xw):
    x, _ = xw
    w1, w3 = rand(64, K, seed=4, scale=0.5), rand(64, K, seed=5, scale=0.5)   # many |g|, |u| > L
    lin = make_linear([w1, w3], "fp4")
    h = lin(x).float()
    assert (h.abs() > 3.0).any()
    fused = lin(x, swiglu_limit=3.0)
    unfused = clamped_swiglu(h[:, :64], h[:, 64:], 3.0)
    torch.testing.assert_close(fused.float(), unfused, rtol=2 ** -6, atol=2e-2)


def test_fp4_every_call_goes_through_the_backend_and_is_logged(xw):
    x, w = xw
    d = dispatcher()
    lin = make_linear([w], "fp4", disp=d, name="layers.0.attn.wq_a")
    assert d.log.missing() == ["layers.0.attn.wq_a [attn_q]: no gemm/quantize_activation on 'emulated'"]
    lin(x)
    lin(x)
    assert d.log.counts[("attn_q", "emulated", "gemm")] == 2
    assert d.log.counts[("attn_q", "emulated", "quantize_activation")] == 2
    assert d.log.missing() == []


def test_non_fp4_formats_reject_a_fused_epilogue(xw):
    x, w = xw
    for fmt in ("bf16", "fp8"):
        with pytest.raises(ValueError, match="fp4"):
            make_linear([w], fmt)(x, swiglu_limit=10.0)
