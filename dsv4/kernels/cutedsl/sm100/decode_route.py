"""Which sm_100a kernel takes a dense GEMM of decode size: the decode kernel (``DecodeGemm100``:
swap-AB, ``tcgen05`` block-scaled MMA into TMEM, split-K) or the generic tile kernel. Pure Python, so
the rule is unit-tested without a GPU.

The thresholds are the sm_90a ones (``sm90/decode_route.py``, measured on an H100: the decode kernel
faster from 2,048 weight rows at 1-16 tokens); nothing here has been timed on a B200. The route is on
because that is the design the backend is meant to ship (the same rule on both archs), and every call
it takes is judged by the per-call audit like any other: a B200 user sees a wrong route as violating
calls, and ``Sm100Backend(routes=False)`` is the generic kernel alone, for the bench and for a bisect.
The grouped (MoE) form (``grouped_decode_launch.GroupedDecodeGemm100``) is written and compiled but has
never run on a B200, so its route is off: ``GROUPED_DECODE_ROUTE = False`` keeps every grouped GEMM on
the generic kernel until a B200 has run ``test_sm100_grouped_decode.py`` and the model through it.
"""
from __future__ import annotations

MAX_DECODE_TOKENS = 16
MIN_WEIGHT_ROWS = 2048    # the sm_90a threshold (H100-measured), not yet measured on a B200
DECODE_ROUTE = True


def use_decode_kernel(m: int, n: int, k: int) -> bool:
    """True for ``m`` tokens x an ``n`` x ``k`` weight that the rule sends to the decode kernel."""
    return DECODE_ROUTE and 1 <= m <= MAX_DECODE_TOKENS and n >= MIN_WEIGHT_ROWS and k % 32 == 0


# Off until the grouped decode kernel has run on a B200 (see the module docstring).
GROUPED_DECODE_ROUTE = False


def use_grouped_decode_kernel(rows: int, experts: int, k: int) -> bool:
    """True for a grouped GEMM of ``rows`` rows over ``experts`` groups routed sparsely (at most one row
    per group on average: the sm_90a rule, ``sm90/decode_route.use_decode_kernel_grouped``), while the
    route is on."""
    return GROUPED_DECODE_ROUTE and 1 <= rows <= max(experts, 0) and k % 32 == 0
