"""Which sm_90a path takes a dense GEMM of prefill size: ``PrefillGemm`` (exact BF16 dequantization +
cuBLAS) or the generic kernel. Pure Python, so the rule is unit-tested without a GPU.

Off until its GPU run: ``benchmarks/bench_nvfp4_shapes.py`` times the route (``pre``) beside the generic
kernel and cuBLAS BF16 at every Flash and Pro shape for M >= ``MIN_PREFILL_TOKENS``.
"""
from __future__ import annotations

MIN_PREFILL_TOKENS = 64
PREFILL_ROUTE = False


def use_prefill_gemm(m: int, n: int, k: int) -> bool:
    """True for ``m`` tokens x an ``n`` x ``k`` weight where the prefill route is in force."""
    return PREFILL_ROUTE and m >= MIN_PREFILL_TOKENS and n >= 1 and k % 16 == 0
