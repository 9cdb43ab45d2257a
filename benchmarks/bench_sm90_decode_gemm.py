"""Decode NVFP4 GEMM on Hopper: the new warp-specialized kernel (``DecodeGemm``) vs the current
``Sm90Backend.gemm`` vs cuBLAS BF16, at DeepSeek-V4 Pro / Flash decode shapes, M in {1, 4, 16}.

    PYTHONPATH=. python benchmarks/bench_sm90_decode_gemm.py [--json out.json] [--quick] [--sweep] [--no-grouped]

Per case: first a correctness check of the new kernel (max |new - Sm90Backend| and max
|new - emulated|, relative to max |y|), then kernel-only times under CUDA-graph replay (``reps``
calls per graph cycling over enough weight copies that the weights do not stay in the 50 MB L2,
median of 5 replays). Bandwidth = bytes moved / time (FP4: weights + scales + activations + output;
BF16: weights + activations + output), against the HBM bandwidth measured in the same run (a 2 GiB
read-only reduction and a 1 GiB device-to-device copy; the larger is the roofline). Targets:
>= 70 % of roofline and >= 2.5x cuBLAS BF16. ``--sweep`` also times launch-plan variants of the new
kernel (bk, stages, consumer warps, CTAs per SM) per dense case. Grouped cases: a decode step of T
tokens routed top-6 over the model's experts (``DecodeGemm.grouped`` vs ``Sm90Backend.grouped_gemm``
vs ``torch._grouped_mm`` on BF16 weights; bytes = the active experts' weights).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

L2_BYTES = 50 * 2**20
MS = (1, 4, 16)
# (name, N weight rows, K, fused SwiGLU)
PRO = [("pro expert w1 7168->3072", 3072, 7168, False), ("pro expert w2 3072->7168", 7168, 3072, False),
       ("pro wq_a 7168->1536", 1536, 7168, False), ("pro shared w13+SwiGLU 7168->2x3072", 6144, 7168, True),
       ("pro 7168->4096", 4096, 7168, False), ("pro 2048->7168", 7168, 2048, False),
       ("pro lm_head 7168->129280", 129280, 7168, False)]
FLASH = [("flash expert w13+SwiGLU 4096->2x2048", 4096, 4096, True), ("flash expert w2 2048->4096", 4096, 2048, False),
         ("flash wq_a 4096->1024", 1024, 4096, False), ("flash lm_head 4096->129280", 129280, 4096, False)]
# grouped MoE decode: (name, N per expert, K, SwiGLU, experts), each token routed to 6 experts
GROUPED = [("pro experts w13+SwiGLU 6-of-384", 6144, 7168, True, 384), ("pro experts w2 6-of-384", 7168, 3072, False, 384),
           ("flash experts w13+SwiGLU 6-of-256", 4096, 4096, True, 256),
           ("flash experts w2 6-of-256", 4096, 2048, False, 256)]
VARIANTS = [dict(), dict(stages=6), dict(bk=128, stages=8), dict(consumer_warps=8, stages=8, ctas_per_sm=1),
            dict(ctas_per_sm=3, stages=3), dict(ctas_per_sm=4), dict(rows=64), dict(rows=64, ctas_per_sm=3, stages=5),
            dict(max_splits=32), dict(rows=256, ctas_per_sm=1), dict(rows=256, consumer_warps=8, ctas_per_sm=1),
            dict(copy16=False), dict(copy16=True, stages=6), dict(copy16=True, ctas_per_sm=3, stages=3)]
ERRORS: list[str] = []


def log(msg: str) -> None:
    print(msg, flush=True)


def graph_us(fns: list, reps: int = 20) -> float:
    """Median time per call of ``fns`` (cycled) captured ``reps`` times in one CUDA graph
    (bench_nvfp4_gemm's measurement); a failed measurement is recorded and reads NaN."""
    from bench_nvfp4_gemm import _graph_us_impl

    try:
        return _graph_us_impl(fns, reps)
    except Exception as e:  # one failed measurement must not end the run
        ERRORS.append(f"graph: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.synchronize()
        return float("nan")


def _correctness(row: dict, new: torch.Tensor, old: torch.Tensor, ref: torch.Tensor) -> None:
    """The new kernel against the existing one and the emulated backend, written into ``row``."""
    torch.cuda.synchronize()
    scale = float(ref.float().abs().max()) or 1.0
    row["max_abs_diff_vs_backend"] = float((new.float() - old.float()).abs().max())
    row["max_abs_diff_vs_emulated"] = float((new.float() - ref.float()).abs().max())
    row["max_abs_y"] = scale
    row["backend_vs_emulated"] = float((old.float() - ref.float()).abs().max())
    row["ok"] = bool(torch.isfinite(new.float()).all()) and row["max_abs_diff_vs_emulated"] <= max(
        4 * row["backend_vs_emulated"], 2.0 ** -6 * scale)


def _plan_row(plan) -> dict:
    return {"tiles": plan.tiles, "splits": plan.splits, "ctas": plan.ctas, "cfg": str(plan.cfg)}


def measure_hbm() -> dict:
    """Read-only reduction over 2 GiB and a 1 GiB D2D copy (read + write), GB/s."""
    x = torch.ones(2**30, dtype=torch.bfloat16, device="cuda")  # 2 GiB
    y = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")  # 1 GiB
    res = {}
    for name, fn, nbytes in (("read_reduce", lambda: x.sum(dtype=torch.float32), x.numel() * 2),
                             ("d2d_copy", lambda: y.copy_(x[:y.numel()]), 2 * y.numel() * 2)):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(7):
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            fn()
            t1.record()
            t1.synchronize()
            ts.append(t0.elapsed_time(t1) * 1e-3)
        res[name] = nbytes / min(ts)
    del x, y
    torch.cuda.empty_cache()
    res["roofline"] = max(res["read_reduce"], res["d2d_copy"])
    return res


def fp4_bytes(rows: int, k: int) -> int:
    return rows * k // 2 + rows * k // 16


def copies_for(nbytes: int) -> int:
    return max(1, min(8, -(-3 * L2_BYTES // max(nbytes, 1))))


def run_case(be, dg, emu, name, n, k, swiglu, m, hbm, sweep: bool) -> dict:
    import bench_nvfp4_gemm as nb

    from dsv4.kernels.contract import ActQuantRequest, GemmRequest
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    limit = 7.0 if swiglu else None
    n_out = n // 2 if swiglu else n
    w_bytes = fp4_bytes(n, k)
    ws = [nb._fp4_weight(n, k) for _ in range(copies_for(w_bytes))]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    aq = be.quantize_activation(ActQuantRequest(x, global_scale=torch.tensor(0.01, device="cuda"),
                                                scale_layout="swizzled"))
    row = {"case": name, "n": n, "k": k, "m": m, "swiglu": swiglu}
    # ---- correctness first
    req = GemmRequest(aq, ws[0], swiglu_limit=limit)
    new, old = dg(req), be.gemm(req)
    ref = emu.gemm(req)
    _correctness(row, new, old, ref)
    plan = dg.plan(m, n, k, swiglu)
    row["plan"] = _plan_row(plan)
    # ---- timing
    io = w_bytes + fp4_bytes(m, k) + 2 * m * n_out
    row["new_us"] = graph_us([lambda w=w: dg(GemmRequest(aq, w, swiglu_limit=limit)) for w in ws])
    row["old_us"] = graph_us([lambda w=w: be.gemm(GemmRequest(aq, w, swiglu_limit=limit)) for w in ws])
    del ws
    wb_bytes = 2 * n * k
    wbs = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies_for(wb_bytes))]
    row["bf16_us"] = graph_us([lambda w=w: x @ w.t() for w in wbs])
    del wbs
    bf_io = wb_bytes + 2 * m * k + 2 * m * n
    _rates(row, io, bf_io, hbm)
    if sweep:
        row["sweep"] = []
        ws = [nb._fp4_weight(n, k) for _ in range(copies_for(w_bytes))]
        for kw in VARIANTS:
            try:
                dv = DecodeGemm("cuda", **kw)
                outv = dv(GemmRequest(aq, ws[0], swiglu_limit=limit))
                same = bool(torch.equal(outv, dv(GemmRequest(aq, ws[0], swiglu_limit=limit))))
                dv_ok = float((outv.float() - dg(GemmRequest(aq, ws[0], swiglu_limit=limit)).float()).abs().max())
                us = graph_us([lambda w=w: dv(GemmRequest(aq, w, swiglu_limit=limit)) for w in ws])
                p = dv.plan(m, n, k, swiglu)
                row["sweep"].append({"variant": kw, "us": us, "roof": io / (us * 1e-6) / hbm["roofline"],
                                     "ctas": p.ctas, "splits": p.splits, "deterministic": same,
                                     "max_abs_diff_vs_default": dv_ok})
            except Exception as e:
                ERRORS.append(f"sweep {name} M={m} {kw}: {type(e).__name__}: {str(e)[:200]}")
        del ws
    torch.cuda.empty_cache()
    return row


def _rates(row: dict, io: int, bf_io: int, hbm: dict) -> None:
    """Achieved GB/s and share of the measured roofline of each timing, and the speedups."""
    for key, b in (("new", io), ("old", io), ("bf16", bf_io)):
        us = row[f"{key}_us"]
        row[f"{key}_GBps"] = b / (us * 1e-6) / 1e9 if us == us and us > 0 else float("nan")
        row[f"{key}_roof"] = b / (us * 1e-6) / hbm["roofline"] if us == us and us > 0 else float("nan")
    row["speedup_vs_bf16"] = row["bf16_us"] / row["new_us"]
    row["speedup_vs_backend"] = row["old_us"] / row["new_us"]


def run_grouped_case(be, dg, emu, name, n, k, swiglu, experts, tokens, w_fp4, w_bf16, hbm) -> dict:
    from dsv4.kernels.contract import ActQuantRequest, GroupedGemmRequest

    from bench_nvfp4_gemm import _bf16_grouped, _routing

    offs_cpu, counts = _routing(tokens, torch.Generator().manual_seed(tokens), experts)
    m, active = int(offs_cpu[-1]), int((counts > 0).sum())
    offs = offs_cpu.cuda()
    limit = 7.0 if swiglu else None
    n_out = n // 2 if swiglu else n
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    g = torch.tensor(0.01, device="cuda")
    aq = be.quantize_activation(ActQuantRequest(x, global_scale=g, scale_layout="swizzled"))
    req = GroupedGemmRequest(aq, w_fp4, offs, (g * w_fp4.global_scale).float(), swiglu_limit=limit)
    req.validate()
    row = {"case": name, "n": n, "k": k, "m": tokens, "rows": m, "active_experts": active, "swiglu": swiglu}
    new, old = dg.grouped(req), be.grouped_gemm(req)
    ref = emu.grouped_gemm(req)
    _correctness(row, new, old, ref)
    plan = dg.grouped_plan(m, experts, n, k, swiglu)
    row["plan"] = _plan_row(plan)
    row["new_us"] = graph_us([lambda: dg.grouped(req, check_values=False)])
    row["old_us"] = graph_us([lambda: be.grouped_gemm(req, check_values=False)])
    bf16, row["baseline"] = _bf16_grouped(x, w_bf16, offs, offs_cpu, counts, n)
    row["bf16_us"] = graph_us([bf16])
    io = active * fp4_bytes(n, k) + fp4_bytes(m, k) + 2 * m * n_out
    bf_io = active * 2 * n * k + 2 * m * k + 2 * m * n
    _rates(row, io, bf_io, hbm)
    return row


def render(rows: list[dict], hbm: dict) -> None:
    log(f"\nHBM measured: read-reduce {hbm['read_reduce'] / 1e9:.0f} GB/s, D2D copy {hbm['d2d_copy'] / 1e9:.0f} GB/s "
        f"-> roofline {hbm['roofline'] / 1e9:.0f} GB/s")
    hdr = (f"{'case':38s} {'M':>3s} {'new us':>8s} {'old us':>8s} {'bf16 us':>8s} {'new GB/s':>9s} {'%roof':>6s} "
           f"{'old %':>6s} {'bf16 %':>6s} {'x bf16':>7s} {'x old':>6s} {'CTAs':>5s} {'spl':>4s} {'ok':>3s} {'|d| vs emu':>10s}")
    log(hdr)
    log("-" * len(hdr))
    for r in rows:
        good = r["new_roof"] >= 0.7 and r["speedup_vs_bf16"] >= 2.5
        log(f"{r['case'][:38]:38s} {r['m']:3d} {r['new_us']:8.1f} {r['old_us']:8.1f} {r['bf16_us']:8.1f} "
            f"{r['new_GBps']:9.0f} {100 * r['new_roof']:5.0f}% {100 * r['old_roof']:5.0f}% {100 * r['bf16_roof']:5.0f}% "
            f"{r['speedup_vs_bf16']:6.2f}x{'*' if good else ' '} {r['speedup_vs_backend']:5.2f}x "
            f"{r['plan']['ctas']:5d} {r['plan']['splits']:4d} {'yes' if r['ok'] else 'NO':>3s} "
            f"{r['max_abs_diff_vs_emulated']:10.3g}")
        for v in r.get("sweep", []):
            log(f"{'   variant ' + json.dumps(v['variant']):48s} {v['us']:8.1f} us  {100 * v['roof']:4.0f}% roof  "
                f"CTAs {v['ctas']}  det {v['deterministic']}  |d| {v['max_abs_diff_vs_default']:.3g}")
    log("(* = meets both targets: >= 70 % roofline and >= 2.5x cuBLAS BF16)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows here (default: $OUT/bench_sm90_decode_gemm.json if $OUT)")
    ap.add_argument("--quick", action="store_true", help="Pro shapes only, M in {1, 16}")
    ap.add_argument("--sweep", action="store_true", help="also time launch-plan variants of the new kernel")
    ap.add_argument("--no-grouped", action="store_true", help="skip the MoE (grouped) decode cases")
    ap.add_argument("--budget-s", type=float, default=220.0, help="skip cases that would start after this many seconds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        log("needs an sm_90 (Hopper) GPU")
        return 2
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm
    from dsv4.kernels.emulated import EmulatedBackend

    t0 = time.time()
    torch.manual_seed(0)
    be, dg, emu = Sm90Backend("cuda"), DecodeGemm("cuda"), EmulatedBackend()
    hbm = measure_hbm()
    log(f"{torch.cuda.get_device_name()}: HBM read {hbm['read_reduce'] / 1e9:.0f} GB/s, copy {hbm['d2d_copy'] / 1e9:.0f} GB/s "
        f"({time.time() - t0:.0f} s)")
    shapes = PRO if args.quick else PRO + FLASH
    ms = (1, 16) if args.quick else MS
    rows, skipped = [], []
    for name, n, k, sw in shapes:
        for m in ms:
            if time.time() - t0 > args.budget_s:
                skipped.append(f"{name} M={m}")
                continue
            try:
                r = run_case(be, dg, emu, name, n, k, sw, m, hbm, args.sweep)
            except Exception as e:
                ERRORS.append(f"{name} M={m}: {type(e).__name__}: {str(e)[:300]}")
                log(f"FAILED {name} M={m}: {type(e).__name__}: {str(e)[:300]}")
                torch.cuda.synchronize()
                continue
            rows.append(r)
            log(f"{name} M={m}: new {r['new_us']:.1f} us ({100 * r['new_roof']:.0f}% roof), old {r['old_us']:.1f} us, "
                f"bf16 {r['bf16_us']:.1f} us, x{r['speedup_vs_bf16']:.2f} vs bf16, ok={r['ok']} "
                f"(|new-emu| {r['max_abs_diff_vs_emulated']:.3g}, |old-emu| {r['backend_vs_emulated']:.3g}, "
                f"|new-old| {r['max_abs_diff_vs_backend']:.3g}, max|y| {r['max_abs_y']:.3g}) [{time.time() - t0:.0f} s]")
    if not args.no_grouped:
        for name, n, k, sw, experts in (GROUPED[:2] if args.quick else GROUPED):
            if time.time() - t0 > args.budget_s:
                skipped.append(name)
                continue
            try:
                from bench_nvfp4_gemm import _fp4_weight
                w_fp4 = _fp4_weight(n, k, experts)
                w_bf16 = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
                for m in ms:
                    r = run_grouped_case(be, dg, emu, name, n, k, sw, experts, m, w_fp4, w_bf16, hbm)
                    rows.append(r)
                    log(f"{name} T={m} ({r['rows']} rows, {r['active_experts']} experts): new {r['new_us']:.1f} us "
                        f"({100 * r['new_roof']:.0f}% roof), old {r['old_us']:.1f} us, bf16 {r['bf16_us']:.1f} us, "
                        f"x{r['speedup_vs_bf16']:.2f} vs bf16, ok={r['ok']} (|new-emu| {r['max_abs_diff_vs_emulated']:.3g}, "
                        f"|old-emu| {r['backend_vs_emulated']:.3g}) [{time.time() - t0:.0f} s]")
            except Exception as e:
                ERRORS.append(f"{name}: {type(e).__name__}: {str(e)[:300]}")
                log(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}")
            finally:
                w_fp4 = w_bf16 = None
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
    render(rows, hbm)
    for e in ERRORS[:20]:
        log(f"error: {e}")
    if skipped:
        log(f"skipped (budget {args.budget_s:.0f} s): {skipped}")
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_sm90_decode_gemm.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "hbm": hbm, "errors": ERRORS,
                                          "skipped": skipped, "seconds": time.time() - t0, "rows": rows}, indent=1))
        log(f"wrote {path}")
    return 0 if all(r["ok"] for r in rows) and not ERRORS else 1


if __name__ == "__main__":
    raise SystemExit(main())
