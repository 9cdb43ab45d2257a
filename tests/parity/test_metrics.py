"""The tensor metrics: definitions, the properties that make rel_diff worth having, non-finite
handling, per-token curves."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from parity.metrics import (ShapeMismatchError, compare_tensors, cosine, max_abs, per_token_cosine,
                            per_token_rel_diff, rel_diff, rel_l2, snr_db)


def _pair(seed: int, n: int = 64, noise: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, 8, generator=g)
    return a, a + noise * torch.randn(n, 8, generator=g)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), noise=st.floats(1e-4, 2.0), scale=st.floats(0.1, 10.0))
def test_rel_diff_bounds_one_minus_cosine(seed: int, noise: float, scale: float) -> None:
    a, b = _pair(seed, noise=noise)
    b = b * scale
    assert rel_diff(a, b) >= 1 - cosine(a, b) - 1e-12


def test_scale_error_shows_in_rel_diff_not_in_cosine() -> None:
    a, _ = _pair(0)
    b = a * 1.05   # a wrong global scale
    assert cosine(a, b) == pytest.approx(1.0, abs=1e-12)
    assert rel_diff(a, b) > 1e-4
    assert rel_l2(a, b) == pytest.approx(0.05, rel=1e-5)   # a * 1.05 is rounded to fp32


def test_identical_tensors() -> None:
    a, _ = _pair(1)
    c = compare_tensors(a, a.clone())
    assert (c.cosine, c.rel_diff, c.rel_l2, c.max_abs) == (1.0, 0.0, 0.0, 0.0)
    assert math.isinf(c.snr_db) and c.snr_db > 0


def test_definitions_match_hand_computation() -> None:
    a = torch.tensor([[3.0, 0.0], [0.0, 4.0]])
    b = torch.tensor([[3.0, 1.0], [0.0, 2.0]])
    dot, na2, nb2 = 9 + 8, 25, 9 + 1 + 4
    assert cosine(a, b) == pytest.approx(dot / math.sqrt(na2 * nb2))
    assert rel_diff(a, b) == pytest.approx(1 - 2 * dot / (na2 + nb2))
    assert rel_l2(a, b) == pytest.approx(math.sqrt(1 + 4) / 5)
    assert max_abs(a, b) == 2.0
    assert snr_db(a, b) == pytest.approx(10 * math.log10(25 / 5))
    assert per_token_cosine(a, b).tolist() == pytest.approx([3 / math.sqrt(10), 1.0])
    assert per_token_rel_diff(a, b).tolist() == pytest.approx([1 - 18 / 19, 1 - 16 / 20])


def test_compare_tensors_agrees_with_single_metrics() -> None:
    a, b = _pair(7, noise=0.3)
    c = compare_tensors(a.bfloat16(), b.bfloat16())
    # compare_tensors works in float32 (float64 after the row sums); the single metrics in float64
    assert c.cosine == pytest.approx(cosine(a.bfloat16(), b.bfloat16()), abs=1e-7)
    assert c.rel_diff == pytest.approx(rel_diff(a.bfloat16(), b.bfloat16()), rel=1e-6)
    assert c.snr_db == pytest.approx(snr_db(a.bfloat16(), b.bfloat16()))
    s = c.scalars()
    assert s["rel_diff_tok_max"] >= s["rel_diff_tok_p50"] >= 0
    assert s["cosine_tok_min"] <= s["cosine"] + 1e-12


def test_worst_token_localizes_a_one_token_error() -> None:
    a, _ = _pair(3, noise=0.0)
    b = a.clone()
    b[17] *= -1
    c = compare_tensors(a, b)
    assert c.worst_token() == 17
    assert c.per_token_cosine[17] == pytest.approx(-1.0)
    assert c.scalars()["rel_diff_tok_p50"] == 0.0   # the median token is untouched


def test_zero_tensors() -> None:
    z = torch.zeros(4, 3)
    c = compare_tensors(z, z)
    assert (c.cosine, c.rel_diff, c.rel_l2) == (1.0, 0.0, 0.0)
    c = compare_tensors(z, torch.ones(4, 3))
    assert c.cosine == 0.0 and math.isinf(c.rel_l2)


def test_masked_scores_compare_finite_entries_and_count_pattern_mismatches() -> None:
    a = torch.tensor([[1.0, 2.0, -math.inf], [3.0, -math.inf, -math.inf]])
    same = compare_tensors(a, a.clone())
    assert same.nonfinite_mismatch == 0 and same.cosine == pytest.approx(1.0)
    b = a.clone()
    b[0, 2] = 5.0          # unmasked where the anchor masks
    c = compare_tensors(a, b)
    assert c.nonfinite_mismatch == 1
    assert c.cosine == pytest.approx(1.0)   # the finite-on-both entries still agree
    nan = a.clone()
    nan[1, 0] = math.nan
    assert compare_tensors(a, nan).nonfinite_mismatch == 1


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ShapeMismatchError, match="anchor"):
        compare_tensors(torch.zeros(3, 4), torch.zeros(4, 3))


def test_tiny_differences_keep_their_relative_precision() -> None:
    """rel_diff near 0 is computed from sum (x - y)^2, not as 1 - (something near 1)."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(50, 64, generator=g)
    b = a + 1e-5 * torch.randn(50, 64, generator=g)
    exact = float(((a.double() - b.double()) ** 2).sum() / ((a.double() ** 2).sum() + (b.double() ** 2).sum()))
    assert exact < 1e-9
    assert compare_tensors(a, b).rel_diff == pytest.approx(exact, rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(5, 3), (64, 4, 96), (1, 1), (300, 7, 13)])
def test_row_sums_through_one_scratch_tensor_equal_fresh_products_bit_for_bit(dtype, shape):
    from parity.metrics import _row_sums, _rows

    g = torch.Generator().manual_seed(sum(shape))
    a = torch.randn(shape, generator=g, dtype=dtype)
    b = a + 1e-3 * torch.randn(shape, generator=g, dtype=dtype)
    x, y = _rows(a), _rows(b)
    d = x - y
    want = torch.stack([(x * y).sum(1), (x * x).sum(1), (y * y).sum(1), (d * d).sum(1)]).to(torch.float64).numpy()
    got, got_d = _row_sums(x, y)
    assert got.tobytes() == want.tobytes() and torch.equal(got_d, d)
