"""NVFP4 GEMM (sm_90a CuTe DSL kernels) vs cuBLAS BF16 at DeepSeek-V4-Pro shapes, on one H200.

    PYTHONPATH=. python benchmarks/bench_nvfp4_gemm.py [--json out.json] [--quick]

Per case: the NVFP4 GEMM alone, activation quantization + GEMM, and the BF16 baseline (``x @ W.t()``
through cuBLAS; grouped: ``torch._grouped_mm`` when it runs, else one matmul per active expert), each
timed with ``triton.testing.do_bench`` (L2 flushed before every call) and under CUDA-graph replay
(the graph cycles through enough weight copies that the weights do not stay in the 60 MB L2).
Roofline: weight + weight-scale + activation + activation-scale + output bytes at 4.25 TB/s (the
H200's measured copy bandwidth); "+q" adds the BF16 activation read. Targets: decode >= 2.5x cuBLAS
BF16 and >= 70 % of roofline; prefill >= 0.8x cuBLAS BF16. SwiGLU cases: the baseline runs the GEMM
only (no activation), which favours the baseline.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
from rich.console import Console
from rich.table import Table

HBM_BPS = 4.25e12
L2_BYTES = 60 * 2**20
DECODE_MS = (1, 4, 16)
PREFILL_M = 4096
EXPERTS, TOPK = 384, 6


@dataclass
class Row:
    case: str
    m: int
    kind: str  # dense | grouped
    fp4_us: float = 0.0
    fp4q_us: float = 0.0
    bf16_us: float = 0.0
    fp4_graph_us: float = 0.0
    fp4q_graph_us: float = 0.0
    bf16_graph_us: float = 0.0
    fp4_queued_us: float = 0.0
    bf16_queued_us: float = 0.0
    roofline_us: float = 0.0
    roofline_q_us: float = 0.0
    baseline: str = "cuBLAS x@W.t()"
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def _pick(graph: float, queued: float) -> float:
        return graph if graph == graph and graph > 0 else queued  # graph figure unless it failed

    @property
    def speedup_graph(self) -> float:
        fp4 = self._pick(self.fp4_graph_us, self.fp4_queued_us)
        return self._pick(self.bf16_graph_us, self.bf16_queued_us) / fp4 if fp4 else 0.0

    @property
    def speedup_bench(self) -> float:
        return self.bf16_us / self.fp4_us if self.fp4_us else 0.0

    @property
    def roof_frac(self) -> float:
        fp4 = self._pick(self.fp4_graph_us, self.fp4_queued_us)
        return self.roofline_us / fp4 if fp4 else 0.0


def _do_bench(fn) -> float:
    from triton.testing import do_bench

    try:
        return float(do_bench(fn, warmup=10, rep=60)) * 1e3  # ms -> us
    except Exception as e:  # one failed measurement must not end the run; shown as nan
        _ERRORS.append(f"do_bench: {type(e).__name__}: {str(e)[:200]}")
        return float("nan")


_ERRORS: list[str] = []


def _graph_us(fns: list, reps: int = 20) -> float:
    try:
        return _graph_us_impl(fns, reps)
    except Exception as e:
        _ERRORS.append(f"graph: {type(e).__name__}: {str(e)[:200]}")
        torch.cuda.synchronize()
        return float("nan")


def _queued_us(fns: list, reps: int = 20) -> float:
    """GPU time per call of ``reps`` eager calls queued behind a sleep kernel, so that host overhead
    is hidden (a cross-check of the graph figure that needs no capture)."""
    try:
        for f in fns:
            f()
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time to queue the calls behind
        t0.record()
        for i in range(reps):
            fns[i % len(fns)]()
        t1.record()
        t1.synchronize()
        return t0.elapsed_time(t1) * 1e3 / reps
    except Exception as e:
        _ERRORS.append(f"queued: {type(e).__name__}: {str(e)[:200]}")
        return float("nan")


def _graph_us_impl(fns: list, reps: int) -> float:
    """Mean time per call of ``fns`` (cycled) captured ``reps`` times in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:  # warm up: compile, allocate, load modules outside the capture
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        g.replay()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1e3 / reps)
    return statistics.median(times)


def _copies(weight_bytes: int) -> int:
    return max(1, min(8, -(-3 * L2_BYTES // max(weight_bytes, 1))))


# ----------------------------------------------------------------------------- operands
def _fp4_weight(n: int, k: int, groups: int = 1):
    from dsv4.kernels.contract import FP4Operand
    from dsv4.kernels.cutedsl.common import swizzle_linear_scales

    packed = torch.randint(0, 256, (groups * n, k // 2), dtype=torch.uint8, device="cuda")
    sc = (torch.rand(groups * n, k // 16, device="cuda") * 2 + 0.25).to(torch.float8_e4m3fn)
    g = torch.full((groups,), 0.01, device="cuda") if groups > 1 else torch.tensor(0.01, device="cuda")
    return FP4Operand(packed, swizzle_linear_scales(sc, groups), g, k=k, scale_layout="swizzled")


def _bytes_fp4(rows: int, k: int) -> int:
    return rows * k // 2 + rows * k // 16


def bench_dense(be, name: str, n: int, k: int, m: int, swiglu: bool) -> Row:
    from dsv4.kernels.contract import ActQuantRequest, GemmRequest

    limit = 7.0 if swiglu else None
    n_out = n // 2 if swiglu else n
    w_bytes = _bytes_fp4(n, k)
    copies = _copies(w_bytes) if m < PREFILL_M else 1
    ws = [_fp4_weight(n, k) for _ in range(copies)]
    wb = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(min(copies, max(1, -(-3 * L2_BYTES // (2 * n * k)))))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    aq = be.quantize_activation(ActQuantRequest(x, global_scale=torch.tensor(0.01, device="cuda"),
                                                scale_layout="swizzled"))
    g_static = torch.tensor(0.01, device="cuda")

    def fp4(i=0):
        return be.gemm(GemmRequest(aq, ws[i % len(ws)], swiglu_limit=limit))

    def fp4q(i=0):
        a = be.quantize_activation(ActQuantRequest(x, global_scale=g_static, scale_layout="swizzled"),
                                   check_values=False)
        return be.gemm(GemmRequest(a, ws[i % len(ws)], swiglu_limit=limit))

    def bf16(i=0):
        return x @ wb[i % len(wb)].t()

    row = Row(name, m, "dense")
    row.fp4_us, row.fp4q_us, row.bf16_us = _do_bench(fp4), _do_bench(fp4q), _do_bench(bf16)
    row.fp4_graph_us = _graph_us([lambda i=i: fp4(i) for i in range(len(ws))])
    row.fp4q_graph_us = _graph_us([lambda i=i: fp4q(i) for i in range(len(ws))])
    row.bf16_graph_us = _graph_us([lambda i=i: bf16(i) for i in range(len(wb))])
    row.fp4_queued_us = _queued_us([lambda i=i: fp4(i) for i in range(len(ws))])
    row.bf16_queued_us = _queued_us([lambda i=i: bf16(i) for i in range(len(wb))])
    io = w_bytes + _bytes_fp4(m, k) + 2 * m * n_out
    row.roofline_us = io / HBM_BPS * 1e6
    row.roofline_q_us = (io + 2 * m * k) / HBM_BPS * 1e6
    return row


def _routing(tokens: int, gen: torch.Generator, experts: int = EXPERTS):
    ids = torch.stack([torch.randperm(experts, generator=gen)[:TOPK] for _ in range(tokens)]).flatten()
    counts = torch.bincount(ids, minlength=experts)
    offs = torch.zeros(experts + 1, dtype=torch.int32)
    offs[1:] = counts.cumsum(0)
    return offs, counts


def _bf16_grouped(x: torch.Tensor, w_bf16: torch.Tensor, offs: torch.Tensor, offs_cpu: torch.Tensor,
                  counts: torch.Tensor, n: int):
    """The BF16 grouped baseline and its name: torch._grouped_mm where it runs, else per-expert cuBLAS."""
    ends = offs[1:].contiguous()
    w_t = w_bf16.transpose(-2, -1)  # [E, K, N] view of [E, N, K]
    try:
        torch._grouped_mm(x, w_t, offs=ends)
        torch.cuda.synchronize()
        return (lambda: torch._grouped_mm(x, w_t, offs=ends)), "torch._grouped_mm"
    except Exception as e:  # older torch / unsupported layout: per-expert cuBLAS
        spans = [(e_, int(offs_cpu[e_]), int(offs_cpu[e_ + 1])) for e_ in range(len(counts)) if counts[e_] > 0]

        def bf16():
            out = torch.empty(x.shape[0], n, device="cuda", dtype=torch.bfloat16)
            for e_, lo, hi in spans:
                torch.matmul(x[lo:hi], w_bf16[e_].t(), out=out[lo:hi])
            return out
        return bf16, f"per-expert matmul ({type(e).__name__})"


def bench_grouped(be, name: str, n: int, k: int, tokens: int, swiglu: bool, w_fp4, w_bf16) -> Row:
    from dsv4.kernels.contract import ActQuantRequest, GroupedGemmRequest

    gen = torch.Generator().manual_seed(tokens)
    offs_cpu, counts = _routing(tokens, gen)
    m = int(offs_cpu[-1])
    active = int((counts > 0).sum())
    offs = offs_cpu.cuda()
    limit = 7.0 if swiglu else None
    n_out = n // 2 if swiglu else n
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g_static = torch.tensor(0.01, device="cuda")
    aq = be.quantize_activation(ActQuantRequest(x, global_scale=g_static, scale_layout="swizzled"))
    alphas = (g_static * w_fp4.global_scale).float()
    req = GroupedGemmRequest(aq, w_fp4, offs, alphas, swiglu_limit=limit)
    req.validate()  # once with the host reads; the timed calls skip them (check_values=False)

    def fp4():
        return be.grouped_gemm(req, check_values=False)

    def fp4q():
        a = be.quantize_activation(ActQuantRequest(x, global_scale=g_static, scale_layout="swizzled"),
                                   check_values=False)
        return be.grouped_gemm(GroupedGemmRequest(a, w_fp4, offs, alphas, swiglu_limit=limit), check_values=False)

    bf16, baseline = _bf16_grouped(x, w_bf16, offs, offs_cpu, counts, n)

    row = Row(name, tokens, "grouped", baseline=baseline)
    row.notes.append(f"{m} rows over {active} experts")
    row.fp4_us, row.fp4q_us, row.bf16_us = _do_bench(fp4), _do_bench(fp4q), _do_bench(bf16)
    row.fp4_graph_us, row.fp4q_graph_us = _graph_us([fp4]), _graph_us([fp4q])
    row.bf16_graph_us = _graph_us([bf16])
    row.fp4_queued_us, row.bf16_queued_us = _queued_us([fp4]), _queued_us([bf16])
    io = active * _bytes_fp4(n, k) + _bytes_fp4(m, k) + 2 * m * n_out
    row.roofline_us = io / HBM_BPS * 1e6
    row.roofline_q_us = (io + 2 * m * k) / HBM_BPS * 1e6
    return row


def render(rows: list[Row], console: Console) -> None:
    t = Table(title="NVFP4 (CuTe DSL sm_90a) vs BF16 on H200 — microseconds; graph = CUDA-graph replay")
    for c in ("case", "M", "fp4 bench", "fp4 graph", "fp4 queued", "fp4+q graph", "bf16 bench", "bf16 graph",
              "bf16 queued", "speedup graph", "speedup bench", "roofline", "% roof", "baseline"):
        t.add_column(c, justify="right" if c not in ("case", "baseline") else "left")
    for r in rows:
        decode = r.m < PREFILL_M
        target = 2.5 if decode else 0.8
        sp = r.speedup_graph
        ok = sp >= target and (not decode or r.roof_frac >= 0.7)
        t.add_row(r.case, str(r.m), f"{r.fp4_us:.1f}", f"{r.fp4_graph_us:.1f}", f"{r.fp4_queued_us:.1f}",
                  f"{r.fp4q_graph_us:.1f}", f"{r.bf16_us:.1f}", f"{r.bf16_graph_us:.1f}", f"{r.bf16_queued_us:.1f}",
                  f"[{'green' if ok else 'red'}]{sp:.2f}x[/]", f"{r.speedup_bench:.2f}x",
                  f"{r.roofline_us:.1f}", f"{100 * r.roof_frac:.0f}%", r.baseline)
    console.print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="bench_nvfp4_gemm.json")
    ap.add_argument("--quick", action="store_true", help="decode shapes only")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip cases that would start after this many seconds")
    args = ap.parse_args(argv)
    console = Console(width=220)
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend

    be = Sm90Backend("cuda")
    rows: list[Row] = []
    t0 = time.time()
    dense = [("expert w1 7168->3072", 3072, 7168, False), ("expert w2 3072->7168", 7168, 3072, False),
             ("wq_a 7168->1536", 1536, 7168, False), ("shared w13+SwiGLU 7168->2x3072", 6144, 7168, True)]
    grouped = [("experts w13+SwiGLU 6-of-384", 6144, 7168, True), ("experts w2 6-of-384", 7168, 3072, False)]
    phases = [DECODE_MS] + ([] if args.quick else [(PREFILL_M,)])
    skipped = []
    for ms in phases:  # all decode cases first: they are the targets that matter most
        for name, n, k, sw in dense:
            for m in ms:
                if time.time() - t0 > args.budget_s:
                    skipped.append(f"{name} M={m}")
                    continue
                rows.append(bench_dense(be, name, n, k, m, sw))
                console.print(f"[dim]{name} M={m}: fp4 {rows[-1].fp4_graph_us:.1f} us, bf16 "
                              f"{rows[-1].bf16_graph_us:.1f} us ({time.time() - t0:.0f} s)[/dim]")
        for name, n, k, sw in grouped:
            if time.time() - t0 > args.budget_s:
                skipped.append(f"{name} T={ms}")
                continue
            w_fp4 = _fp4_weight(n, k, EXPERTS)
            w_bf16 = torch.randn(EXPERTS, n, k, device="cuda", dtype=torch.bfloat16)
            for m in ms:
                rows.append(bench_grouped(be, name, n, k, m, sw, w_fp4, w_bf16))
                console.print(f"[dim]{name} T={m}: fp4 {rows[-1].fp4_graph_us:.1f} us, bf16 "
                              f"{rows[-1].bf16_graph_us:.1f} us ({time.time() - t0:.0f} s)[/dim]")
            del w_fp4, w_bf16
            torch.cuda.empty_cache()
    render(rows, console)
    for e in _ERRORS[:20]:
        console.print(f"[red]measurement error[/red] {e}")
    if skipped:
        console.print(f"[yellow]skipped (time budget {args.budget_s} s): {skipped}[/yellow]")
    out = {"device": torch.cuda.get_device_name(), "hbm_bps": HBM_BPS, "errors": _ERRORS, "skipped": skipped,
           "rows": [{**asdict(r), "speedup_graph": r.speedup_graph, "speedup_bench": r.speedup_bench,
                     "roofline_fraction": r.roof_frac} for r in rows]}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
