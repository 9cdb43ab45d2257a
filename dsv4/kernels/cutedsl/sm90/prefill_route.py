"""Which sm_90a path takes a dense GEMM of prefill size: ``PrefillGemm`` (exact BF16 dequantization +
cuBLAS) or the generic kernel. Pure Python, so the rule is unit-tested without a GPU.

``PrefillGemm`` pays for dequantizing the whole weight (n x k, BF16 written and read back) once per
call, whatever M, so it wins where M is large enough to amortize that, or the weight is small enough
that the generic kernel's fixed costs dominate. Graph (kernel-only) times on an H100 80GB HBM3, the
route from ``benchmarks/results/h100_bench_nvfp4_shapes_prefill_route_on.json`` (2026-12-07) against
the generic kernel from ``h100_bench_nvfp4_shapes.json`` (2026-12-06): two sessions on the same card
model with the generic kernel's code unchanged between them, the cuBLAS BF16 baseline within 2 % in
every row of both (a side-by-side run, ``run_gpu_validation.sh prefill``, is the confirmation):

* M = 4,096: the route faster at all 22 dense Flash/Pro shapes, 1.05-1.94x (LM head 1.72x / 1.83x);
* M = 512: 0.91-4.96x; the large weights (q/o projections, head) 0.91-1.28x;
* M = 64: weights of at most 12.6 M elements 1.49-3.19x (flash shared-expert w2, 8.4 M, 0.97x),
  larger weights 0.30-1.02x (LM head 0.30x: 1140 vs 362 us).

On since the model's verdicts ran with it on, on an H100 80GB HBM3 (2026-12-07, ``run_gpu_validation.sh
gate``, ``benchmarks/results/h100_gpu_validation_2026-12-07_gate_route_on.json``): first_token chat and
thinking PASS (every column), ``parity.audit run`` 380 calls 0 violating, 300 teacher-forced decode steps
22,800 audited calls 0 violating, CUDA-graph decode equal to eager, the zoo's 5 kernel faults caught and
localized with the clean row quiet; its own 17 GPU tests had passed on that card model the day before
(bit-exact dequant, the accumulation bound, graph capture). The weight audit reads every dense weight
through both this route and the generic kernel (``Sm90Backend.weight_routes``).
"""
from __future__ import annotations

MIN_PREFILL_TOKENS = 64
# from here every weight takes the route (measured faster at 4,096; at 512 the large ones were 0.91-1.28x)
ALL_WEIGHTS_FROM_TOKENS = 1024
# below ALL_WEIGHTS_FROM_TOKENS only weights up to this many elements (measured faster at 64 tokens)
SMALL_WEIGHT_ELEMENTS = 12_582_912  # pro attn.indexer.wq_b, 8192 x 1536: the largest measured faster
PREFILL_ROUTE = True


def use_prefill_gemm(m: int, n: int, k: int) -> bool:
    """True for ``m`` tokens x an ``n`` x ``k`` weight where the prefill route is in force."""
    if not (PREFILL_ROUTE and m >= MIN_PREFILL_TOKENS and n >= 1 and k % 16 == 0):
        return False
    return m >= ALL_WEIGHTS_FROM_TOKENS or n * k <= SMALL_WEIGHT_ELEMENTS
