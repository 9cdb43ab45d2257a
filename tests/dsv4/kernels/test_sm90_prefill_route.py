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


def _fake_prefill(monkeypatch, l2_bytes):
    """PrefillGemm's graph-safe form with torch standing in for its kernels (dequant, cuBLAS, epilogue):
    the column-block bookkeeping alone, on the CPU."""
    from types import SimpleNamespace

    import torch

    from dsv4.kernels.cutedsl.sm90 import prefill_gemm as pgm
    from dsv4.kernels.emulated import _epilogue

    monkeypatch.setattr(pgm, "capturing", lambda: True)
    monkeypatch.setattr(pgm, "fp32_product", lambda a, w: a.float() @ w.float().t())
    pg = pgm.PrefillGemm("cpu", column_blocks=l2_bytes is not None, l2_bytes=l2_bytes)
    pg._warm = True
    pg.dequant = lambda op: op.deq
    pg._launch_epilogue = lambda y, ga, gb, m, n, limit: _epilogue(y * (ga * gb), limit)

    def call(a16, w16, limit=None):
        n_out = w16.shape[0] // (2 if limit is not None else 1)
        op = lambda t, g: SimpleNamespace(deq=t, packed=t, global_scale=torch.tensor(g))  # noqa: E731
        return pg(SimpleNamespace(a=op(a16, 0.5), b=op(w16, 0.25), swiglu_limit=limit,
                                  out_shape=(a16.shape[0], n_out)), validated=True)
    return call


def test_column_blocks_assemble_the_one_block_product_exactly(monkeypatch):
    """Integer operands (exact FP32 sums): 1000 output columns in blocks of 384 (the last 232), and SwiGLU
    over [gate 500; up 500] in blocks of 192 gate + 192 up columns, equal the unblocked form bit for bit."""
    import torch

    g = torch.Generator().manual_seed(3)
    a16 = torch.randint(-3, 4, (256, 64), generator=g).to(torch.bfloat16)
    w16 = torch.randint(-3, 4, (1000, 64), generator=g).to(torch.bfloat16)
    blocked = _fake_prefill(monkeypatch, 3 * 4 * 256 * 384)
    whole = _fake_prefill(monkeypatch, None)
    want = (0.125 * (a16.float() @ w16.float().t())).to(torch.bfloat16)
    assert torch.equal(whole(a16, w16), want)
    assert torch.equal(blocked(a16, w16), want)
    got, ref = blocked(a16, w16, 10.0), whole(a16, w16, 10.0)
    assert tuple(got.shape) == (256, 500) and torch.equal(got, ref)
