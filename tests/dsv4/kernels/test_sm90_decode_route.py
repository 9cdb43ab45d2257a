"""The rule that sends dense decode-sized GEMMs to the sm_90a decode kernel (pure Python, no GPU)."""
from __future__ import annotations

from dsv4.kernels.cutedsl.sm90.decode_route import MAX_DECODE_TOKENS, use_decode_kernel


def test_decode_kernel_takes_the_shapes_it_was_measured_faster_at():
    # Pro's LM head, shared w13, 7168->4096, expert w2, 2048->7168 at M = 1 and 16
    for n, k in [(129280, 7168), (6144, 7168), (4096, 7168), (7168, 3072), (7168, 2048)]:
        assert use_decode_kernel(1, n, k) and use_decode_kernel(16, n, k)


def test_generic_kernel_keeps_the_rest():
    assert not use_decode_kernel(1, 1536, 7168)  # wq_a: measured slower
    assert not use_decode_kernel(16, 1536, 7168)
    assert not use_decode_kernel(MAX_DECODE_TOKENS + 1, 4096, 7168)  # prefill-sized
    assert not use_decode_kernel(0, 4096, 7168)
    assert not use_decode_kernel(1, 4096, 7176)  # K not a multiple of 32: rows not 16-byte aligned


def test_grouped_rule_takes_sparse_routing_and_leaves_the_rest(monkeypatch):
    from dsv4.kernels.cutedsl.sm90 import decode_route
    from dsv4.kernels.cutedsl.sm90.decode_route import use_decode_kernel_grouped

    assert decode_route.GROUPED_ROUTE                             # in force
    assert use_decode_kernel_grouped(6, 384, 6144, 7168)          # 1 token, top-6 of 384
    assert use_decode_kernel_grouped(96, 384, 7168, 3072)         # 16 tokens
    assert use_decode_kernel_grouped(384, 384, 6144, 7168)        # 64 tokens: one row an expert on average
    assert not use_decode_kernel_grouped(16 * 8, 8, 1024, 4096)   # wo_a: 16 tokens in each of 8 groups
    assert not use_decode_kernel_grouped(512 * 6, 384, 6144, 7168)  # 512 tokens: 8 rows an expert
    assert not use_decode_kernel_grouped(0, 384, 6144, 7168)
    assert not use_decode_kernel_grouped(6, 384, 6144, 7176)
    monkeypatch.setattr(decode_route, "GROUPED_ROUTE", False)        # the switch turns it all off
    assert not use_decode_kernel_grouped(6, 384, 6144, 7168)
