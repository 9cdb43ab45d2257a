"""Logits statistics: KL direction, agreement with near ties, dp, standard errors, top tokens."""
from __future__ import annotations

import math

import pytest
import torch

from parity.logits_stats import (AGGREGATE_METRICS, KL_DIRECTION, at_position, position_stats, summarize,
                                 teacher_forced_targets, top_tokens)


def test_kl_is_reference_to_test() -> None:
    p = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    q = torch.tensor([[0.4, 0.4, 0.2]], dtype=torch.float64)
    s = position_stats(p.log(), q.log())
    expected = float((p * (p / q).log()).sum())
    reverse = float((q * (q / p).log()).sum())
    assert s.kl[0].item() == pytest.approx(expected, rel=1e-9)
    assert abs(expected - reverse) > 1e-3   # the direction matters for this example
    assert "reference || test" in KL_DIRECTION


def test_identical_logits() -> None:
    x = torch.randn(10, 50, generator=torch.Generator().manual_seed(0))
    agg = summarize(position_stats(x, x.clone()))
    assert agg["kl_mean"] == 0.0 and agg["top1_agree_rate"] == 1.0 and agg["topk_overlap_mean"] == 1.0
    assert agg["dp_rms"] == 0.0 and agg["kl_max"] == 0.0
    assert set(agg) <= set(AGGREGATE_METRICS)


def test_near_tie_flip_is_forgiven_but_clear_flip_is_not() -> None:
    ref = torch.tensor([[2.00, 1.99, 0.0], [3.0, 1.0, 0.0]])
    test = torch.tensor([[1.99, 2.00, 0.0], [1.0, 3.0, 0.0]])
    s = position_stats(ref, test, near_tie=0.1)
    assert s.top1_agree.tolist() == [False, False]
    assert s.near_tie.tolist() == [True, False]
    assert at_position(s, 0)["top1_agree_tieaware"] == 1.0
    assert at_position(s, 1)["top1_agree_tieaware"] == 0.0
    agg = summarize(s)
    assert agg["top1_agree_rate"] == 0.0 and agg["top1_agree_tieaware_rate"] == 0.5


def test_binomial_standard_error_and_dp_sign() -> None:
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(200, 30, generator=g)
    test = ref + 0.8 * torch.randn(200, 30, generator=g)
    s = position_stats(ref, test)
    agg = summarize(s)
    p = agg["top1_agree_rate"]
    assert agg["top1_agree_se"] == pytest.approx(math.sqrt(p * (1 - p) / 200))
    assert agg["kl_se"] == pytest.approx(float(s.kl.std()) / math.sqrt(200))
    # at the reference argmax (no target given) the test side can only lose probability on average
    assert agg["dp_mean"] < 0
    assert agg["kl_p50"] <= agg["kl_p99"] <= agg["kl_p99.9"] <= agg["kl_max"]


def test_teacher_forced_targets_and_ppl_ratio() -> None:
    ids = torch.tensor([5, 7, 9])
    assert teacher_forced_targets(ids).tolist() == [7, 9, -1]
    ref = torch.zeros(3, 10)
    ref[:, 7] = 2.0
    test = ref.clone()
    test[0, 7] = 1.0    # the test side likes the real next token less at position 0
    agg = summarize(position_stats(ref, test, teacher_forced_targets(ids)))
    assert agg["ln_ppl_ratio_mean"] > 0   # test perplexity higher than the reference's


def test_top_tokens_reports_both_sides() -> None:
    ref = torch.tensor([0.0, 3.0, 2.0, 1.0])
    test = torch.tensor([0.0, 1.0, 3.0, 2.0])
    rows = top_tokens(ref, test, 3)
    assert [r.token_id for r in rows] == [1, 2, 3]
    assert [r.test_rank for r in rows] == [3, 1, 2]
    assert rows[0].ref_prob == pytest.approx(float(torch.softmax(ref, 0)[1]))


def _stats_equal(a, b, tol: float = 0.0) -> None:
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        assert x.device.type == "cpu" and y.device.type == "cpu" and x.shape == y.shape, f
        if x.dtype == torch.bool or not x.is_floating_point():
            assert torch.equal(x, y), f
        else:
            assert torch.allclose(x, y, rtol=tol, atol=tol, equal_nan=True), f


def test_position_stats_in_chunks_of_positions_equal_one_pass(monkeypatch) -> None:
    import parity.logits_stats as ls

    g = torch.Generator().manual_seed(5)
    ref, test = torch.randn(37, 300, generator=g) * 4, torch.randn(37, 300, generator=g) * 4
    targets = torch.randint(0, 300, (37,), generator=g)
    targets[-1] = -1
    whole = position_stats(ref, test, targets)
    monkeypatch.setattr(ls, "POSITION_CHUNK_ELEMENTS", 300 * 5)   # 5 positions a chunk, a ragged last one
    _stats_equal(position_stats(ref, test, targets), whole)


@pytest.mark.gpu
def test_position_stats_on_the_gpu_match_the_host() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator().manual_seed(6)
    ref, test = torch.randn(64, 4096, generator=g) * 4, torch.randn(64, 4096, generator=g) * 4
    _stats_equal(position_stats(ref.cuda(), test, None), position_stats(ref, test, None), tol=1e-12)
    # host tensors, computed on the run's GPU (the harness's probes come back on the host)
    _stats_equal(position_stats(ref, test, None, device="cuda"), position_stats(ref, test, None), tol=1e-12)
