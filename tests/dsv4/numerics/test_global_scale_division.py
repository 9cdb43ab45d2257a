"""The runtime global scale is one IEEE FP32 division ``amax / 2688`` on every device.

CUDA torch computes ``tensor / python_number`` as ``tensor * (1 / number)``, which is one ulp off
the quotient for some amax: the oracle once did that on the GPU while the kernels divide
(``div.rn.f32``), and the audit saw a one-ulp global-scale mismatch on every such call."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dsv4.numerics import nvfp4_runtime_global_scale
from dsv4.numerics.nvfp4 import FP4_AMAX_PER_GLOBAL


def amaxes_where_reciprocal_differs(n: int = 64) -> np.ndarray:
    rng = np.random.default_rng(0)
    a = (rng.random(200_000, dtype=np.float32) * np.float32(8.0)).astype(np.float32)
    div = a / np.float32(FP4_AMAX_PER_GLOBAL)
    mul = a * (np.float32(1.0) / np.float32(FP4_AMAX_PER_GLOBAL))
    picked = a[div != mul][:n]
    assert picked.size == n, "the sample must contain amaxes where the two formulas differ"
    return picked


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_global_scale_is_the_ieee_quotient(where: str) -> None:
    for amax in amaxes_where_reciprocal_differs():
        x = torch.tensor([[float(amax), -float(amax) / 4] * 8], dtype=torch.float32, device=where)
        want = np.float32(amax) / np.float32(FP4_AMAX_PER_GLOBAL)
        got = nvfp4_runtime_global_scale(x)
        assert got.device.type == where
        assert float(got) == float(want), (float(amax), float(got), float(want))

