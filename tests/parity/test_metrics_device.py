"""``compare_tensors`` on the run's GPU: the same metrics as on the CPU (float32 row sums in another
order: equal to ~1e-6 relative), exact where they must be (identical tensors), and the non-finite path."""
from __future__ import annotations

import pytest
import torch

from parity.metrics import compare_tensors, metric_device

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is present on this machine")


def test_metric_device_is_the_cpu_unless_a_cuda_device_is_present() -> None:
    assert metric_device(None) == torch.device("cpu")
    assert metric_device("cpu") == torch.device("cpu")
    want = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert metric_device("cuda").type == want.type


def test_a_cuda_request_without_a_gpu_computes_on_the_cpu_with_identical_results() -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the CPU fallback; this machine has a GPU")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(33, 70, generator=g).bfloat16()
    b = (a.float() + 0.01 * torch.randn(33, 70, generator=g)).bfloat16()
    assert compare_tensors(a, b, "cuda").scalars() == compare_tensors(a, b).scalars()


def _pair(rows: int, cols: int, dtype: torch.dtype, pinned: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rows * 7 + cols)
    a = torch.randn(rows, cols, generator=g).to(dtype)
    b = (a.float() * (1 + 0.02 * torch.randn(rows, cols, generator=g))).to(dtype)
    return (a.pin_memory(), b.pin_memory()) if pinned else (a, b)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,pinned", [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)])
def test_gpu_metrics_equal_the_cpu_metrics(dtype: torch.dtype, pinned: bool) -> None:
    a, b = _pair(257, 4096, dtype, pinned)
    cpu, dev = compare_tensors(a, b), compare_tensors(a, b, "cuda")
    for k, v in cpu.scalars().items():
        assert dev.scalars()[k] == pytest.approx(v, rel=1e-5, abs=1e-9), k
    assert torch.allclose(dev.per_token_cosine, cpu.per_token_cosine, rtol=1e-6, atol=1e-9)
    assert torch.allclose(dev.per_token_rel_diff, cpu.per_token_rel_diff, rtol=1e-5, atol=1e-12)
    assert dev.max_abs == cpu.max_abs                       # one element's difference: exact in any order


@gpu
@pytest.mark.gpu
def test_gpu_metrics_of_identical_tensors_are_exact() -> None:
    a, _ = _pair(64, 1024, torch.bfloat16, True)
    c = compare_tensors(a, a.clone(), "cuda")
    assert (c.cosine, c.rel_diff, c.max_abs, c.nonfinite_mismatch) == (1.0, 0.0, 0.0, 0)


@gpu
@pytest.mark.gpu
def test_gpu_metrics_count_nonfinite_mismatches_like_the_cpu() -> None:
    a, b = _pair(16, 64, torch.float32, False)
    a[3, 5], b[3, 5] = float("-inf"), float("-inf")         # agreement
    b[7, 1] = float("nan")                                   # a mismatch
    cpu, dev = compare_tensors(a, b), compare_tensors(a, b, "cuda")
    assert dev.nonfinite_mismatch == cpu.nonfinite_mismatch == 1
    assert dev.cosine == pytest.approx(cpu.cosine, rel=1e-12)


@gpu
@pytest.mark.gpu
def test_a_comparison_too_large_for_the_gpu_is_made_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import parity.metrics as pm

    a, b = _pair(64, 1024, torch.bfloat16, True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *d: (1024, 1 << 40))   # 1 KiB free
    assert not pm._fits(a.numel(), torch.float32, torch.device("cuda"))
    assert compare_tensors(a, b, "cuda").scalars() == compare_tensors(a, b).scalars()   # the CPU's, bit for bit

