"""The rule that sends dense prefill-sized GEMMs to ``PrefillGemm`` (pure Python, no GPU)."""
from __future__ import annotations

from dsv4.kernels.cutedsl.sm90 import prefill_route
from dsv4.kernels.cutedsl.sm90.decode_route import MAX_DECODE_TOKENS
from dsv4.kernels.cutedsl.sm90.prefill_route import MIN_PREFILL_TOKENS, use_prefill_gemm


def test_prefill_route_starts_above_the_decode_sizes():
    assert MIN_PREFILL_TOKENS > MAX_DECODE_TOKENS


def test_prefill_route_takes_prefill_sizes_only_when_in_force(monkeypatch):
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", True)
    assert use_prefill_gemm(4096, 65536, 1536) and use_prefill_gemm(MIN_PREFILL_TOKENS, 64, 7168)
    assert not use_prefill_gemm(MIN_PREFILL_TOKENS - 1, 4096, 7168)
    assert not use_prefill_gemm(4096, 4096, 7176)  # K not a multiple of 16: not an NVFP4 operand
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", False)
    assert not use_prefill_gemm(4096, 65536, 1536)
