"""Where the sm_90a decode GEMM's time goes: controlled variants timed side by side, and a profiler
region for Nsight Compute.

    PYTHONPATH=. python benchmarks/profile_sm90_decode_gemm.py [--json out.json]
    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \
        python benchmarks/profile_sm90_decode_gemm.py --ncu-region

Per shape, kernel-only (CUDA-graph replay) times of: the kernel with its weights cycled over enough
copies that they leave the 50 MB L2 (as the bench), the same with one copy (weights L2-resident after
the first call), the ``copy16`` variant (weight rows by coalesced 16-byte cp.async instead of one
TMA bulk copy per row), an empty launch (one tiny elementwise kernel: the per-kernel floor of a graph), and
cuBLAS BF16; then the grouped (MoE) form at Pro's 6-of-384 routing with and without ``copy16``.
If the L2-resident time is close to the L2-defeated one, DRAM is not what limits the
kernel. ``--ncu-region`` then runs each shape's kernel and the BF16 GEMM once inside
``cudaProfilerStart/Stop`` so that ncu (``--profile-from-start off``) sees exactly those launches.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (name, N weight rows, K, tokens)
SHAPES = [("pro expert w1 7168->3072", 3072, 7168, 1), ("pro wq_a 7168->1536", 1536, 7168, 16),
          ("pro 7168->4096", 4096, 7168, 1), ("pro lm_head 7168->129280", 129280, 7168, 1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the timings here")
    ap.add_argument("--ncu-region", action="store_true", help="only run the profiled launches (under ncu)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs an sm_90 (Hopper) GPU")
        return 2
    from bench_nvfp4_gemm import _fp4_weight
    from bench_sm90_decode_gemm import copies_for, fp4_bytes, graph_us, measure_hbm

    from dsv4.kernels.contract import ActQuantRequest, GemmRequest
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend
    from dsv4.kernels.cutedsl.sm90.decode_launch import DecodeGemm

    torch.manual_seed(0)
    # the one-bulk-copy-per-row form (the dense default before copy16) beside copy16
    be = Sm90Backend("cuda")
    dg = DecodeGemm("cuda", copy16=False, reduce_ilp=False)
    dg16 = DecodeGemm("cuda", copy16=True, reduce_ilp=False)
    # copy16 with the split-K sum's loads of one split issued together (DecodeConfig.reduce_ilp)
    dg16r = DecodeGemm("cuda", copy16=True, reduce_ilp=True)
    cases = []
    for name, n, k, m in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        aq = be.quantize_activation(ActQuantRequest(x, global_scale=torch.tensor(0.01, device="cuda"),
                                                    scale_layout="swizzled"))
        cases.append((name, n, k, m, x, aq))
    if args.ncu_region:
        ops = []
        for name, n, k, m, x, aq in cases:
            w, wb = _fp4_weight(n, k), torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            dg(GemmRequest(aq, w))  # compile / warm outside the region
            dg16(GemmRequest(aq, w))
            dg16r(GemmRequest(aq, w))
            x @ wb.t()
            ops.append((lambda aq=aq, w=w: dg(GemmRequest(aq, w)), lambda aq=aq, w=w: dg16(GemmRequest(aq, w)),
                        lambda aq=aq, w=w: dg16r(GemmRequest(aq, w)), lambda x=x, wb=wb: x @ wb.t()))
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for fns in ops:
            for f in fns:
                f()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        for (name, n, k, m, *_), _ in zip(cases, ops):
            print(f"profiled: {name} M={m}: decode kernel, copy16, copy16+reduce_ilp, then cuBLAS BF16")
        return 0
    hbm = measure_hbm()
    tiny = torch.zeros(1, device="cuda")
    floor = graph_us([lambda: tiny.add_(1)])
    print(f"{torch.cuda.get_device_name()}: roofline {hbm['roofline'] / 1e9:.0f} GB/s; empty launch in a graph {floor:.2f} us")
    rows = []
    for name, n, k, m, x, aq in cases:
        ws = [_fp4_weight(n, k) for _ in range(copies_for(fp4_bytes(n, k)))]
        cold = graph_us([lambda w=w: dg(GemmRequest(aq, w)) for w in ws])
        cold16 = graph_us([lambda w=w: dg16(GemmRequest(aq, w)) for w in ws])
        cold16r = graph_us([lambda w=w: dg16r(GemmRequest(aq, w)) for w in ws])
        same16 = bool(torch.equal(dg(GemmRequest(aq, ws[0])), dg16(GemmRequest(aq, ws[0]))))
        same16r = bool(torch.equal(dg16(GemmRequest(aq, ws[0])), dg16r(GemmRequest(aq, ws[0]))))
        w0 = ws[0]
        warm = graph_us([lambda: dg(GemmRequest(aq, w0))])
        ws = w0 = None  # free the copies before the BF16 weight
        wb = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bf16_warm = graph_us([lambda: x @ wb.t()])
        plan = dg.plan(m, n, k, False)
        io = fp4_bytes(n, k)
        row = {"case": name, "m": m, "l2_defeated_us": cold, "l2_resident_us": warm, "empty_launch_us": floor,
               "copy16_l2_defeated_us": cold16, "copy16_bit_identical": same16,
               "copy16_reduce_ilp_l2_defeated_us": cold16r, "reduce_ilp_bit_identical": same16r,
               "bf16_l2_resident_us": bf16_warm if 2 * n * k < 40 * 2**20 else None,
               "roofline_us": io / hbm["roofline"] * 1e6, "ctas": plan.ctas, "splits": plan.splits,
               "cfg": str(plan.cfg)}
        rows.append(row)
        print(f"{name} M={m}: L2-defeated {cold:.1f} us, L2-resident {warm:.1f} us, copy16 {cold16:.1f} us "
              f"(bit-identical {same16}), +reduce_ilp {cold16r:.1f} us (bit-identical {same16r}), BF16 L2-resident {bf16_warm:.1f} us, roofline {row['roofline_us']:.1f} us, "
              f"{plan.ctas} CTAs x {plan.splits} splits")
        torch.cuda.empty_cache()
    rows += grouped_rows(be, dg, dg16)
    path = args.json or (str(Path(os.environ["OUT"]) / "profile_sm90_decode_gemm.json") if os.environ.get("OUT") else None)
    if path:
        Path(path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "hbm": hbm, "rows": rows}, indent=1))
    return 0


# MoE decode: (name, N per expert, K, SwiGLU, experts); T tokens each routed to 6 experts
GROUPED = [("pro experts w13+SwiGLU 6-of-384", 6144, 7168, True, 384), ("pro experts w2 6-of-384", 7168, 3072, False, 384)]


def grouped_rows(be, dg, dg16) -> list[dict]:
    """The grouped form with and without copy16 (split-K sum as the dense variants it is handed)."""
    from bench_nvfp4_gemm import _fp4_weight, _routing
    from bench_sm90_decode_gemm import graph_us

    from dsv4.kernels.contract import ActQuantRequest, GroupedGemmRequest

    rows = []
    for name, n, k, sw, experts in GROUPED:
        w = _fp4_weight(n, k, experts)
        for tokens in (1, 16):
            offs_cpu, counts = _routing(tokens, torch.Generator().manual_seed(tokens), experts)
            m = int(offs_cpu[-1])
            g = torch.tensor(0.01, device="cuda")
            aq = be.quantize_activation(ActQuantRequest(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                                                        global_scale=g, scale_layout="swizzled"))
            req = GroupedGemmRequest(aq, w, offs_cpu.cuda(), (g * w.global_scale).float(), swiglu_limit=7.0 if sw else None)
            bulk = graph_us([lambda: dg.grouped(req, check_values=False)])
            c16 = graph_us([lambda: dg16.grouped(req, check_values=False)])
            same = bool(torch.equal(dg.grouped(req), dg16.grouped(req)))
            rows.append({"case": name, "m": tokens, "rows": m, "active_experts": int((counts > 0).sum()),
                         "grouped_bulk_us": bulk, "grouped_copy16_us": c16, "copy16_bit_identical": same})
            print(f"{name} T={tokens} ({m} rows): per-row bulk copies {bulk:.1f} us, copy16 {c16:.1f} us "
                  f"(bit-identical {same})")
        w = None
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
