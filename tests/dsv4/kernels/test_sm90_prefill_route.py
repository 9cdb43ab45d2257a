"""The rule that sends dense prefill-sized GEMMs to ``PrefillGemm`` (pure Python, no GPU)."""
from __future__ import annotations

from dsv4.kernels.cutedsl.sm90 import prefill_route
from dsv4.kernels.cutedsl.sm90.decode_route import MAX_DECODE_TOKENS
from dsv4.kernels.cutedsl.sm90.prefill_route import (ALL_WEIGHTS_FROM_TOKENS, MIN_PREFILL_TOKENS,
                                                      SMALL_WEIGHT_ELEMENTS, use_prefill_gemm)


def test_prefill_route_starts_above_the_decode_sizes():
    assert MAX_DECODE_TOKENS < MIN_PREFILL_TOKENS < ALL_WEIGHTS_FROM_TOKENS


def test_prefill_route_takes_prefill_sizes_only_when_in_force(monkeypatch):
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", True)
    assert use_prefill_gemm(4096, 65536, 1536) and use_prefill_gemm(MIN_PREFILL_TOKENS, 64, 7168)
    assert not use_prefill_gemm(MIN_PREFILL_TOKENS - 1, 4096, 7168)
    assert not use_prefill_gemm(4096, 4096, 7176)  # K not a multiple of 16: not an NVFP4 operand
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", False)
    assert not use_prefill_gemm(4096, 65536, 1536)


def test_large_weights_wait_for_enough_tokens(monkeypatch):
    """The LM head (129,280 x 7,168) at 64 tokens was 3.3x slower through the route: it needs
    ALL_WEIGHTS_FROM_TOKENS; a weight of SMALL_WEIGHT_ELEMENTS takes the route from the start."""
    monkeypatch.setattr(prefill_route, "PREFILL_ROUTE", True)
    assert not use_prefill_gemm(64, 129280, 7168)
    assert not use_prefill_gemm(ALL_WEIGHTS_FROM_TOKENS - 1, 129280, 7168)
    assert use_prefill_gemm(ALL_WEIGHTS_FROM_TOKENS, 129280, 7168)
    assert use_prefill_gemm(64, 8192, 1536) and 8192 * 1536 == SMALL_WEIGHT_ELEMENTS
    assert not use_prefill_gemm(64, 8192, 1552)  # one block of 16 past the bound


def test_fp32_column_blocks_fit_a_third_of_the_l2_in_multiples_of_128():
    from dsv4.kernels.cutedsl.sm90.prefill_gemm import column_block

    l2 = 50 * 2**20                                     # an H100's
    assert column_block(512, 4096, l2) == 4096          # 8 MiB of FP32: one block
    assert column_block(4096, 32768, l2) == 1024        # 16 MiB blocks
    for m, n in [(4096, 32768), (8192, 4096), (4096, 129280), (64, 129280), (100000, 256)]:
        c = column_block(m, n, l2)
        assert c == n or (c % 128 == 0 and (4 * m * c * 3 <= l2 or c == 128)), (m, n, c)
        assert c == n or 4 * m * (c + 128) * 3 > l2      # the widest such block
