"""Decode-shape launch sweep of the sm_90a NVFP4 GEMM on one H200: is the ~15 % of roofline a tuning problem?

For Pro decode shapes (expert w1 7168->3072, w2 3072->7168; M = 1 and 16) the backend's launch
heuristic is swapped (``unittest.mock.patch``) for variants of raw cp.async stages, K per stage, CTAs
per SM and split-count rounding; each variant is timed under CUDA-graph replay over enough weight
copies to defeat the L2 (``bench_nvfp4_gemm``'s timer) and printed next to the shipped heuristic
(ratio > 1: the variant is faster) with its fraction of the HBM roofline.

    PYTHONPATH=. python benchmarks/sweep_sm90_decode_configs.py [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from unittest import mock

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_nvfp4_gemm as gemm_bench  # noqa: E402

# (label, raw_stages, bk, CTAs per SM, floor rounding of the split count); None = the shipped value
VARIANTS = [("shipped", None, None, None, False), ("1 CTA/SM", None, None, 1, False),
            ("2 CTA/SM, floor", None, None, 2, True), ("3 CTA/SM, floor", None, None, 3, True),
            ("4 CTA/SM, floor", None, None, 4, True), ("raw 4", 4, None, None, False),
            ("raw 8", 8, None, None, False), ("raw 12", 12, None, None, False),
            ("bk 256, raw 4", 4, 256, None, False), ("raw 8, 3 CTA/SM floor", 8, None, 3, True)]
SHAPES = [("expert w1 7168->3072", 3072, 7168), ("expert w2 3072->7168", 7168, 3072)]


def launch_patches(C, raw, bk, cps, floor):
    base_cfg = C.decode_config

    def cfg(q_tile, *, grouped, swiglu, k):
        c = base_cfg(q_tile, grouped=grouped, swiglu=swiglu, k=k)
        return dataclasses.replace(c, raw_stages=raw or c.raw_stages, bk=bk or c.bk)

    def splits(base_ctas, k, bk_, num_sms):
        per_sm = cps or C.CTAS_PER_SM
        k_tiles = C._cdiv(k, bk_)
        want = (per_sm * num_sms) // max(base_ctas, 1) if floor else C._cdiv(per_sm * num_sms, max(base_ctas, 1))
        s = max(1, min(want, C.MAX_SPLITS, max(k_tiles // 2, 1)))
        return C._cdiv(k_tiles, C._cdiv(k_tiles, s))

    return mock.patch.object(C, "decode_config", cfg), mock.patch.object(C, "_splits", splits)


def measure(be, C, n: int, k: int, m: int, variant) -> dict:
    from dsv4.kernels.contract import ActQuantRequest, GemmRequest

    label, raw, bk, cps, floor = variant
    p1, p2 = launch_patches(C, raw, bk, cps, floor)
    with p1, p2:
        ws = [gemm_bench._fp4_weight(n, k) for _ in range(gemm_bench._copies(gemm_bench._bytes_fp4(n, k)))]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        aq = be.quantize_activation(ActQuantRequest(x, global_scale=torch.tensor(0.01, device="cuda"),
                                                    scale_layout="swizzled"))
        launch = C.dense_launch(m, n, k, swiglu=False, num_sms=be._sms())
        us = gemm_bench._graph_us([lambda i=i: be.gemm(GemmRequest(aq, ws[i])) for i in range(len(ws))])
    roof = gemm_bench._bytes_fp4(n, k) / gemm_bench.HBM_BPS * 1e6
    return {"variant": label, "n": n, "k": k, "m": m, "raw_stages": launch.cfg.raw_stages, "bk": launch.cfg.bk,
            "ctas": launch.tiles * launch.splits, "splits": launch.splits, "us": us, "roofline_fraction": roof / us}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    console = Console(width=160)
    if not torch.cuda.is_available():
        console.print("[red]needs a CUDA device (sm_90): the sweep times the CuTe DSL kernels[/red]")
        return 2
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend
    from dsv4.kernels.cutedsl.sm90 import configs as C

    be = Sm90Backend("cuda")
    rows = []
    table = Table(title=f"sm_90a decode GEMM launch sweep on {torch.cuda.get_device_name()} — CUDA-graph replay, "
                  "L2 defeated", title_justify="left")
    for c in ("shape", "M", "variant", "raw", "bk", "CTAs", "splits", "us", "shipped / variant", "roofline"):
        table.add_column(c, justify="right")
    for name, n, k in SHAPES:
        for m in (1, 16):
            shipped = None
            for v in VARIANTS:
                r = measure(be, C, n, k, m, v)
                shipped = shipped or r["us"]
                rows.append({"shape": name, **r, "shipped_over_variant": shipped / r["us"]})
                table.add_row(name, str(m), r["variant"], str(r["raw_stages"]), str(r["bk"]), str(r["ctas"]),
                              str(r["splits"]), f"{r['us']:.1f}", f"{shipped / r['us']:.2f}x",
                              f"{r['roofline_fraction']:.0%}")
    console.print(table)
    out = args.json or (str(Path(os.environ["OUT"]) / "sweep_sm90_decode_configs.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "errors": gemm_bench._ERRORS,
                                         "rows": rows}, indent=1))
        console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
