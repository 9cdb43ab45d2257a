"""``compare_tensors`` on the run's GPU: the same metrics as on the CPU (float32 row sums in another
order: equal to ~1e-6 relative), exact where they must be (identical tensors), and the non-finite path."""
from __future__ import annotations

import numpy as np
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
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *d: (1024, 1 << 40))   # 1 KiB free: not one row
    assert pm.block_plan(64, 1024, torch.float32, torch.device("cuda")) == (torch.device("cpu"), 64)
    assert compare_tensors(a, b, "cuda").scalars() == compare_tensors(a, b).scalars()   # the CPU's, bit for bit


@gpu
@pytest.mark.gpu
def test_a_comparison_larger_than_the_gpus_room_is_made_there_in_row_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    import parity.metrics as pm

    a, b = _pair(64, 1024, torch.bfloat16, True)
    whole = compare_tensors(a, b, "cuda")
    room = 2 * 10 * 1024 * pm.BYTES_PER_ELEMENT[torch.float32]                      # 10 rows in half of it
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *d: (room, 1 << 40))
    assert pm.block_plan(64, 1024, torch.float32, torch.device("cuda")) == (torch.device("cuda"), 10)
    blocks = compare_tensors(a, b, "cuda")
    for k, v in whole.scalars().items():
        assert blocks.scalars()[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    assert torch.allclose(blocks.per_token_cosine, whole.per_token_cosine, rtol=1e-6)



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_blocks_give_the_one_block_metrics_on_the_cpu(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """Every metric is a sum of per-row sums: blocks of rows (here 3 of 16) change nothing, bit for bit.
    With a non-finite entry only its block takes the float64 path (the whole did): the same mismatch
    count and the finite blocks' rows bit for bit."""
    import parity.metrics as pm

    a, b = _pair(16, 64, dtype, False)
    whole = compare_tensors(a, b)
    monkeypatch.setattr(pm, "block_plan", lambda rows, cols, work, dev: (torch.device("cpu"), 3))
    blocks = compare_tensors(a, b)
    assert blocks.scalars() == whole.scalars()
    assert np.array_equal(blocks.row_sums, whole.row_sums)
    assert torch.equal(blocks.per_token_rel_diff, whole.per_token_rel_diff)
    a[4, 5], b[4, 5] = float("-inf"), float("-inf")      # agreement, in rows 3..5
    b[11, 1] = float("nan")                              # a mismatch, in rows 9..11
    monkeypatch.undo()
    whole_nf = compare_tensors(a, b)
    monkeypatch.setattr(pm, "block_plan", lambda rows, cols, work, dev: (torch.device("cpu"), 3))
    blocks_nf = compare_tensors(a, b)
    assert blocks_nf.nonfinite_mismatch == whole_nf.nonfinite_mismatch == 1
    for k, v in whole_nf.scalars().items():
        assert blocks_nf.scalars()[k] == pytest.approx(v, rel=1e-6), k
    finite_rows = [r for r in range(16) if r // 3 not in (1, 3)]
    assert np.array_equal(blocks_nf.row_sums[:, finite_rows], blocks.row_sums[:, finite_rows])
