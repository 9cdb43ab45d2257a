"""The decode bench's measure of the device's own work: interval union on the CPU, the profiler on a GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from decode_kernel_time import busy_us, device_work  # noqa: E402


def test_busy_merges_overlaps_and_keeps_gaps():
    assert busy_us([]) == 0.0
    assert busy_us([(0, 10), (5, 15), (20, 25)]) == 20.0       # [0,15) and [20,25)
    assert busy_us([(20, 25), (0, 10), (10, 12)]) == 17.0      # touching intervals join; order does not matter
    assert busy_us([(3, 3), (5, 4)]) == 0.0                    # empty and inverted add nothing
    assert busy_us([(0, 100), (10, 20), (30, 40)]) == 100.0    # nested


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200)), max_size=30))
def test_busy_equals_the_covered_points(raw):
    # integer intervals: the union's length is the number of unit cells some interval covers
    cells = {x for s, e in raw for x in range(s, e)}
    assert busy_us(raw) == len(cells)
    assert busy_us(raw) <= sum(max(e - s, 0) for s, e in raw)


def test_device_work_rejects_no_steps():
    with pytest.raises(ValueError, match="steps: expected >= 1, found 0"):
        device_work(lambda: None, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA profiler traces kernels)")
def test_device_work_counts_the_kernels_of_a_step():
    a = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()

    def step():
        (a @ a).relu_()       # a GEMM and an elementwise kernel

    w = device_work(step, 4)
    assert w["device_activities_per_step"] >= 2
    assert 0 < w["busy_ms_per_step"] <= w["kernel_ms_per_step"] + 1e-9
