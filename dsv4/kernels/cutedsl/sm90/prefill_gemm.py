"""``PrefillGemm``: dense NVFP4 GEMMs of prefill size on sm_90a as exact BF16 dequantization + cuBLAS.

At thousands of tokens a GEMM is bound by tensor-core throughput, and the generic kernel, which decodes
FP4 inside its main loop, reached 0.19-0.49x cuBLAS BF16 at M = 4096 (H200,
``benchmarks/results/h200_bench_nvfp4_shapes.json``). Here both operands are first dequantized to BF16 by
``dequant_kernel`` (``e2m1 * e4m3``: exact, no global scale), then cuBLAS multiplies them with FP32
accumulation (BF16 products are exact in FP32; reduced-precision BF16 reductions are switched off for
the call), and ``alpha = a.global * b.global`` is applied in FP32 after the product, before the one BF16
rounding: the contract's arithmetic (``contract.py``), judged by the same bound as every kernel.

``alpha`` goes to cuBLAS as its scalar (one host read of the two global scales, so one stream sync per
call) and cuBLAS writes BF16. While a CUDA graph is being captured, or with the fused SwiGLU (whose
gate and up must stay FP32 until the epilogue), cuBLAS writes FP32 instead and one kernel pass
(``epilogue_kernel``: alpha from the two device scalars, SwiGLU as the generic kernel computes it, BF16)
finishes: no host read, more memory traffic. The extra memory is one BF16 copy of each operand.

That FP32 product can be made in column blocks small enough to stay in the L2 cache (``column_block``:
a third of it; with SwiGLU a block holds its gate columns and the matching up columns, their weight rows
copied together), each finished by the epilogue before the next reuses the buffer, so that the FP32
round trip through HBM (an H100, M = 4,096, 32768 x 1024: 765 us against cuBLAS BF16's 410 us,
``benchmarks/results/h100_bench_nvfp4_shapes_prefill_s4.json``) stays on chip. A column block is an
ordinary GEMM of the same K, accumulated in FP32: the same bound holds. ``PrefillGemm(column_blocks=True)``
cuts them (for ``l2_bytes``, else the card's L2). Timed side by side on an H100 at M = 4,096
(``h100_bench_nvfp4_shapes_prefill_blocks_s5.json``, 22 dense Flash/Pro shapes): slower, median 1.06x the
one-block form's time and 1.38x for Flash ``wq_b`` (1,060 against 766 us), never faster beyond noise;
narrower cuBLAS products lose more than the L2 saves. So ``FP32_COLUMN_BLOCKS`` stays off (its GPU tests
pass: the blocked form is exact, only not faster).
"""
from __future__ import annotations

import contextlib

import torch

from ...contract import FP4Operand, GemmRequest, KernelContractError
from ..common import KernelCache, LaunchResources, capturing, check_cuda, cu_stream, expect, gmem_ptr

ARCH = "sm_90a"
MAX_BLOCKS = 2**31 - 1            # the kernel's block index is 32-bit
MAX_BF16_WEIGHT_BYTES = 4 * 2**30  # the dequantized weight (Pro's LM head: 1.85 GB)
FP32_COLUMN_BLOCKS = False         # the default form's L2-sized FP32 blocks: timed slower (module doc)


def column_block(m: int, n: int, l2_bytes: int) -> int:
    """Output columns per FP32 block: ``n`` when the whole ``[m, n]`` FP32 product fits a third of the L2
    cache, else the most columns that do, a multiple of 128 (cuBLAS tile widths), at least 128."""
    if 4 * m * n * 3 <= l2_bytes:
        return n
    return min(n, max(128, (l2_bytes // 3) // (4 * max(m, 1)) // 128 * 128))


def fp32_product(a16: torch.Tensor, w16: torch.Tensor) -> torch.Tensor:
    """``a16 @ w16^T`` with FP32 accumulation and output (cuBLAS; ``mm.dtype`` has no CPU kernel)."""
    return torch.mm(a16, w16.t(), out_dtype=torch.float32)


@contextlib.contextmanager
def _fp32_reductions():
    """cuBLAS may reduce split-K partials in BF16 unless told not to; the contract accumulates in FP32."""
    m = torch.backends.cuda.matmul
    old = m.allow_bf16_reduced_precision_reduction
    m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_bf16_reduced_precision_reduction = old


class PrefillGemm(LaunchResources):
    """``pg(req)`` for a validated dense ``GemmRequest``; ``pg.dequant(op)`` the BF16 operand alone."""

    def __init__(self, device: torch.device | str = "cuda", *, column_blocks: bool | None = None,
                 l2_bytes: int | None = None):
        self.device = torch.device(device)
        self.column_blocks = FP32_COLUMN_BLOCKS if column_blocks is None else column_blocks
        self.l2_bytes = l2_bytes   # the L2 size the FP32 column blocks are cut for (None: the card's)
        self._exes = KernelCache(scope=("sm90-dequant", str(self.device)))
        self._warm = False  # both epilogue forms compiled and loaded (_warm_epilogues)

    def supports(self, req: GemmRequest) -> bool:
        """Whether this route can take ``req`` (else the generic kernel does): 8-byte aligned packed data,
        block counts within 32 bits, and a dequantized weight of at most ``MAX_BF16_WEIGHT_BYTES``."""
        a, b = req.a, req.b
        return (a.packed.is_cuda and a.packed.data_ptr() % 8 == 0 and b.packed.data_ptr() % 8 == 0
                and a.rows * (a.k // 16) <= MAX_BLOCKS and b.rows * (b.k // 16) <= MAX_BLOCKS
                and 2 * b.rows * b.k <= MAX_BF16_WEIGHT_BYTES)

    def dequant(self, op: FP4Operand) -> torch.Tensor:
        """``e2m1 * e4m3`` of every element as BF16 ``[rows, k]`` (the global scale not applied)."""
        from cutlass import Int32

        from .dequant_kernel import DequantConfig, compile_dequant, dequant_arg_types

        check_cuda(op.packed, "packed")
        expect(op.packed.data_ptr() % 8 == 0, "packed data pointer", "8-byte aligned",
               f"address % 8 = {op.packed.data_ptr() % 8}")
        blocks = op.rows * (op.k // 16)
        expect(blocks <= MAX_BLOCKS, "16-element blocks", f"<= {MAX_BLOCKS}", blocks)
        out = torch.empty(op.rows, op.k, dtype=torch.bfloat16, device=op.packed.device)
        if blocks == 0:
            return out
        cfg = DequantConfig(swizzled=op.scale_layout == "swizzled")
        exe = self._exes.get((ARCH, cfg), lambda: compile_dequant(cfg, ARCH))
        grid = max(1, min(-(-blocks // 256), 16 * self._sms()))
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip((op.packed, op.scales, out), dequant_arg_types())]
        exe(*ptrs, Int32(op.rows), Int32(op.k), Int32(grid), cu_stream(op.packed.device))
        return out

    def __call__(self, req: GemmRequest, *, validated: bool = False) -> torch.Tensor:
        if not validated:
            req.validate()
        alpha = req.a.global_scale * req.b.global_scale  # FP32 product, as every kernel forms it
        in_capture = capturing()
        if not in_capture:
            self._warm_epilogues(req.a.packed.device)
        elif not self._warm:  # before any launch: nothing half-captured
            raise KernelContractError("PrefillGemm inside CUDA-graph capture: call it once outside the capture "
                                      "first (its kernels compile and load then)")
        host_alpha = req.swiglu_limit is None and not in_capture
        if host_alpha:
            alpha_f = float(alpha)  # before the launches below: the sync waits only for earlier work
        a16 = self.dequant(req.a)
        w16 = self.dequant(req.b)
        if host_alpha:
            out = torch.empty(req.out_shape, dtype=torch.bfloat16, device=a16.device)
            with _fp32_reductions():
                return torch.addmm(out, a16, w16.t(), beta=0, alpha=alpha_f, out=out)
        m, n = req.out_shape
        sw = req.swiglu_limit is not None
        blocks = n % 4 == 0 and self.column_blocks
        cols = column_block(m, w16.shape[0], self._l2()) // (2 if sw else 1) if blocks else n
        if cols >= n:
            return self.epilogue(fp32_product(a16, w16), req)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=a16.device)
        for c in range(0, n, cols):   # FP32 output, as the one-block form: no BF16 reduction to switch off
            w = min(cols, n - c)
            # SwiGLU: the block's gate rows, then its up rows (the epilogue's [gate; up] per row)
            wb = torch.cat((w16[c:c + w], w16[n + c:n + c + w])) if sw else w16[c:c + w]
            y = fp32_product(a16, wb)  # freed: the next block reuses it
            out[:, c:c + w] = self._launch_epilogue(y, req.a.global_scale, req.b.global_scale, m, w,
                                                    req.swiglu_limit)
            del y, wb
        return out

    def _l2(self) -> int:
        if self.l2_bytes is None:
            self.l2_bytes = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        return self.l2_bytes

    def epilogue(self, y: torch.Tensor, req: GemmRequest) -> torch.Tensor:
        """FP32 ``y`` -> ``alpha * y`` -> optional SwiGLU -> BF16 in one kernel pass (``epilogue_kernel``,
        the generic kernel's arithmetic); with an output width not a multiple of 4, torch's epilogue."""
        m, n_out = req.out_shape
        if n_out % 4 or m * (n_out // 4) > MAX_BLOCKS or y.data_ptr() % 16:
            from ...emulated import _epilogue

            return _epilogue(y.mul_(req.a.global_scale * req.b.global_scale), req.swiglu_limit)
        return self._launch_epilogue(y, req.a.global_scale, req.b.global_scale, m, n_out, req.swiglu_limit)

    def _launch_epilogue(self, y: torch.Tensor, g_a: torch.Tensor, g_b: torch.Tensor, m: int, n_out: int,
                         limit: float | None) -> torch.Tensor:
        from cutlass import Float32, Int32

        from .epilogue_kernel import EpilogueConfig, compile_epilogue, epilogue_arg_types

        out = torch.empty(m, n_out, dtype=torch.bfloat16, device=y.device)
        if m == 0 or n_out == 0:
            return out
        cfg = EpilogueConfig(swiglu=limit is not None)
        if capturing() and not self._warm:
            raise KernelContractError("PrefillGemm inside CUDA-graph capture: call it once outside the capture "
                                      "first (its kernels compile and load then)")
        exe = self._exes.get((ARCH, cfg), lambda: compile_epilogue(cfg, ARCH))
        grid = max(1, min(-(-(m * n_out // 4) // 256), 16 * self._sms()))
        ptrs = [gmem_ptr(t, dt, al) for t, (dt, al) in zip((y, g_a, g_b, out), epilogue_arg_types())]
        exe(*ptrs, Int32(m), Int32(n_out), Float32(float(limit) if limit is not None else 0.0), Int32(grid),
            cu_stream(y.device))
        return out

    def _warm_epilogues(self, device: torch.device) -> None:
        """Compile, load and launch both epilogue forms once, outside any capture: the eager form of a call
        does not use them, and a graph captured later must not be the first to load them."""
        if self._warm:
            return
        one = torch.ones((), dtype=torch.float32, device=device)
        y = torch.zeros(1, 8, dtype=torch.float32, device=device)
        self._launch_epilogue(y, one, one, 1, 8, None)
        self._launch_epilogue(y, one, one, 1, 4, 1.0)
        self._warm = True
