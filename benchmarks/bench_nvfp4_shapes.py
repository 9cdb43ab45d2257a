"""The NVFP4 GEMMs at every DeepSeek-V4 Flash and Pro shape (issue #44 item 2), on one Hopper or Blackwell GPU.

    PYTHONPATH=. python benchmarks/bench_nvfp4_shapes.py --budget-s 500 --json $OUT/bench_nvfp4_shapes.json
    PYTHONPATH=. python benchmarks/bench_nvfp4_shapes.py --models pro --ms 1,4,16   # one model, decode only

(The first line fits one 600 s device call: the budget leaves ~100 s for the case running when it
ends, the table and the JSON. If it lists skipped cases, run ``--models flash`` and ``--models pro``
as two calls.)

Shapes: ``nvfp4_shapes.gemm_shapes`` (every GEMM of one layer of each kind and the LM head, from the
real configs; identical shapes of a model timed once). M in {1, 4, 16, 64, 512, 4096} tokens; a routed
expert GEMM gets M tokens each routed top-k over the model's experts (seeded random routing,
``bench_nvfp4_gemm._routing``), ``attn.wo_a`` every token in each of its ``o_groups`` groups. Paths:
the shipped NVFP4 path (``Sm90Backend`` / ``Sm100Backend``, by the card: ``nvfp4_arch_kernels.py``;
``.gemm`` / ``.grouped_gemm``; ``fp4_route`` says which kernel it took,
and where that is the decode kernel the generic one is timed too, ``gen``), for M <= 16 also ``DecodeGemm``
(``dg(req)`` / ``dg.grouped(req, check_values=False)``), for dense shapes at M >= 64 the prefill route
``PrefillGemm`` (``pre``: exact BF16 dequantization + cuBLAS; its kernel-only time is the capture-safe
form, FP32 output + torch epilogue, its eager time the form the model's eager prefill takes, cuBLAS
scaling by a host-read alpha; ``preblk``: the same with its FP32 product cut into blocks for the card's L2
cache, JSON only, beside ``pre`` so ``prefill_gemm.FP32_COLUMN_BLOCKS`` is decided from one run), and cuBLAS BF16 (``x @ w.t()``; grouped:
``bench_nvfp4_gemm._bf16_grouped``). Each path is timed twice: kernel-only ("graph": CUDA-graph replay,
weights cycled over enough copies to leave the L2, ``bench_sm90_decode_gemm.graph_us``) and eager
("eager": CUDA events around a loop of plain Python calls, host overhead included; median of 5 loops).
The activation is quantized once outside the timed call (GEMM alone); grouped FP4 calls skip the
contract's host reads (``check_values=False``), and ``fp4_eager_checked_us`` in the JSON is the
shipped grouped call as the model's dispatcher makes it (with them). SwiGLU cases: the BF16 baseline
runs the GEMM only.

Roofline: the bytes the call must move (FP4 weights + E4M3 scales of the active groups only, FP4
activations + scales, BF16 output) / the HBM bandwidth measured in the same run (``measure_hbm``).
Targets (kernel-only times): M <= 16: >= 2.5x BF16 and >= 70 % of roofline; M >= 4096: >= 0.8x BF16;
a routed grouped GEMM (real top-k): >= 3x BF16 grouped at every M (and the roofline target at M <= 16).
``--budget-s`` skips the cases left when the time is up (listed at the end); a failed case is recorded
and the run goes on. The JSON (rewritten after every shape) holds the card, the measured HBM, the shape
table and every row.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
MS = (1, 4, 16, 64, 512, 4096)
DECODE_MAX = 16
PRE_FROM = 64                        # PrefillGemm timed from here, below its route threshold too
SWIGLU_LIMIT = 10.0                  # the configs' swiglu_limit
COPY_CAP_BYTES = 48 * 2**30          # weight copies of one case (one path at a time) stay under this
NEEDS = "needs an sm_90 (Hopper) or sm_100 (Blackwell) GPU"


def log(msg: str) -> None:
    print(msg, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from nvfp4_shapes import MODELS

    p = argparse.ArgumentParser(prog="bench_nvfp4_shapes.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="flash,pro", help="comma-separated: flash, pro")
    p.add_argument("--ms", default=",".join(map(str, MS)), help="token counts M, comma-separated")
    p.add_argument("--budget-s", type=float, default=500.0,
                   help="cases that would start after this many seconds are skipped (and listed)")
    p.add_argument("--json", default=None, help="results (default: $OUT/bench_nvfp4_shapes.json when $OUT is set)")
    a = p.parse_args(argv)
    a.model_list = tuple(m.strip() for m in a.models.split(",") if m.strip())
    if not a.model_list or set(a.model_list) - set(MODELS):
        p.error(f"--models: expected names from {list(MODELS)}, found {a.models!r}")
    try:
        a.m_list = sorted({int(x) for x in a.ms.split(",") if x.strip()})
    except ValueError:
        p.error(f"--ms: expected comma-separated integers, found {a.ms!r}")
    if not a.m_list or a.m_list[0] < 1:
        p.error(f"--ms: expected positive token counts, found {a.ms!r}")
    return a


# ---- pure helpers (CPU-testable) --------------------------------------------------------------------
def io_bytes(shape: Any, rows: int, active: int) -> int:
    """Bytes an NVFP4 call must move: the active groups' FP4 weights + scales, FP4 activations + scales,
    the BF16 output."""
    def fp4(r: int, k: int) -> int:
        return r * k // 2 + r * k // 16
    return active * fp4(shape.n, shape.k) + fp4(rows, shape.k) + 2 * rows * shape.n_out


def targets(m: int, routed: bool, x_bf16: float, roof: float) -> dict[str, bool]:
    """The issue's targets that apply to one row, each met or not (NaN never meets one)."""
    t: dict[str, bool] = {}
    if routed:
        t[">=3x bf16 grouped"] = x_bf16 >= 3.0
    elif m <= DECODE_MAX:
        t[">=2.5x bf16"] = x_bf16 >= 2.5
    elif m >= 4096:
        t[">=0.8x bf16"] = x_bf16 >= 0.8
    if m <= DECODE_MAX:
        t[">=70% roofline"] = roof >= 0.7
    return t


def finish(row: dict, hbm_bps: float) -> None:
    """Speedups, roofline shares and target verdicts of the NVFP4 paths of ``row``."""
    row["roofline_us"] = row["io_bytes"] / hbm_bps * 1e6
    for p in ("fp4", "dec", "pre"):
        g = row.get(f"{p}_graph_us")
        if g is None:
            continue
        ok = g == g and g > 0
        row[f"{p}_x_bf16"] = row.get("bf16_graph_us", math.nan) / g if ok else math.nan
        e = row.get(f"{p}_eager_us", math.nan)
        row[f"{p}_x_bf16_eager"] = row.get("bf16_eager_us", math.nan) / e if e == e and e > 0 else math.nan
        row[f"{p}_roof"] = row["roofline_us"] / g if ok else math.nan
        row[f"{p}_targets"] = targets(row["m"], row["routed"], row[f"{p}_x_bf16"], row[f"{p}_roof"])
        row[f"{p}_met"] = all(row[f"{p}_targets"].values()) if row[f"{p}_targets"] else None


# ---- measurement --------------------------------------------------------------------------------------
def eager_us(fns: list, reps: int, rounds: int = 5) -> float:
    """Per-call time of ``reps`` plain calls (``fns`` cycled) between two CUDA events: what the Python
    call costs, host overhead included; median of ``rounds`` loops."""
    import torch

    for f in fns:
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        for i in range(reps):
            fns[i % len(fns)]()
        t1.record()
        t1.synchronize()
        ts.append(t0.elapsed_time(t1) * 1e3 / reps)
    return statistics.median(ts)


def measure(row: dict, key: str, fns: list, *, graph: bool = True) -> None:
    """``{key}_graph_us`` and ``{key}_eager_us`` into ``row``; a failure reads NaN and is recorded."""
    import bench_sm90_decode_gemm as sd
    import torch

    reps = 20 if row["m"] < 4096 else 5
    if graph:
        n0 = len(sd.ERRORS)
        row[f"{key}_graph_us"] = sd.graph_us(fns, reps)
        row["errors"] += [f"{key} graph: {e}" for e in sd.ERRORS[n0:]]
    try:
        row[f"{key}_eager_us"] = eager_us(fns, reps)
    except Exception as e:  # one failed measurement must not end the run
        row[f"{key}_eager_us"] = math.nan
        row["errors"].append(f"{key} eager: {type(e).__name__}: {str(e)[:300]}")
        torch.cuda.synchronize()


def route(shape: Any, m: int) -> tuple[Any, Any, int, int]:
    """(offsets int32 [E+1] on the host, counts [E], rows, active groups) of M tokens; dense: (None, None, M, 1)."""
    import torch

    import bench_nvfp4_gemm as nb

    if shape.grouped is None:
        return None, None, m, 1
    e, top_k = shape.grouped
    if top_k is None:   # wo_a: every token in every group
        counts = torch.full((e,), m, dtype=torch.int64)
    elif top_k == nb.TOPK:
        counts = nb._routing(m, torch.Generator().manual_seed(m), e)[1]
    else:   # _routing's top-k is fixed (6, both real models): the same draw at another k
        gen = torch.Generator().manual_seed(m)
        ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(m)]).flatten()
        counts = torch.bincount(ids, minlength=e)
    offs = torch.zeros(e + 1, dtype=torch.int32)
    offs[1:] = counts.cumsum(0)
    return offs, counts, int(offs[-1]), int((counts > 0).sum())


def copies(per_active: int, active_min: int, bank: int) -> int:
    """Weight copies: enough to leave the L2 (``copies_for``), capped so one path's copies fit."""
    import torch
    from bench_sm90_decode_gemm import copies_for

    free = torch.cuda.mem_get_info()[0]
    cap = min(COPY_CAP_BYTES, int(0.8 * free))
    return max(1, min(copies_for(per_active * active_min), cap // max(bank, 1)))


def run_shape(kit: Any, shape: Any, ms: list[int], deadline: float, skipped: list[str]) -> list[dict]:
    """Every M of one shape: the FP4 paths first (their weights freed), then the BF16 baseline, with the
    kernels of ``kit`` (``nvfp4_arch_kernels.ArchKernels``). ``gen`` (the backend with routes off) times
    the generic kernel wherever ``be`` routes the call to
    the decode kernel (``decode_route``) or ``PrefillGemm`` (``prefill_route``), so each rule is checked in
    the same run; ``pre`` (``PrefillGemm``) is timed on every dense shape from ``PRE_FROM`` tokens, below
    the route's own threshold too, so the crossover is measured, not assumed."""
    import torch

    import bench_nvfp4_gemm as nb
    from dsv4.kernels.contract import ActQuantRequest, GemmRequest, GroupedGemmRequest
    from nvfp4_arch_kernels import route_of

    be, dg, gen, pre = kit.be, kit.dg, kit.gen, kit.pre

    todo = []
    for m in ms:
        if time.time() > deadline:
            skipped.append(f"{shape.model} {shape.name} M={m}")
        else:
            todo.append((m, *route(shape, m)))
    if not todo:
        return []
    E = shape.grouped[0] if shape.grouped else 1
    limit = SWIGLU_LIMIT if shape.swiglu else None
    g = torch.tensor(0.01, device="cuda")
    rows = [{"model": shape.model, "shape": shape.name, "names": list(shape.names), "n": shape.n, "k": shape.k,
             "swiglu": shape.swiglu, "grouped": list(shape.grouped) if shape.grouped else None,
             "routed": shape.routed, "m": m, "rows": r, "active": a, "io_bytes": io_bytes(shape, r, a),
             "errors": []} for m, _, _, r, a in todo]
    active_min = min(a for *_, a in todo)

    def inputs(r: int) -> tuple[Any, Any]:
        x = torch.randn(r, shape.k, device="cuda", dtype=torch.bfloat16)
        return x, be.quantize_activation(ActQuantRequest(x, global_scale=g, scale_layout="swizzled"))

    # ---- NVFP4: the shipped path and (M <= 16) the decode kernel
    with weights_phase(rows, "fp4") as ws:
        per = shape.n * shape.k // 2 + shape.n * shape.k // 16
        ws += [nb._fp4_weight(shape.n, shape.k, E) for _ in range(copies(per, active_min, E * per))]
        for row, (m, offs_cpu, _, r, _) in zip(rows, todo):
            if time.time() > deadline:
                row["skipped"] = "time budget"
                skipped.append(f"{shape.model} {shape.name} M={m}")
                continue
            try:
                x, aq = inputs(r)
                dec = m <= DECODE_MAX
                if shape.grouped is None:
                    reqs = [GemmRequest(aq, w, swiglu_limit=limit) for w in ws]
                    measure(row, "fp4", [lambda q=q: be.gemm(q) for q in reqs])
                    row["fp4_route"] = route_of(kit.arch, r, shape.n, shape.k)
                    if gen is not None and row["fp4_route"] != "generic":
                        measure(row, "gen", [lambda q=q: gen.gemm(q) for q in reqs])
                    if pre is not None and r >= PRE_FROM and pre.supports(reqs[0]):
                        measure(row, "pre", [lambda q=q: pre(q, validated=True) for q in reqs])
                        if kit.pre_blocks is not None:   # its FP32 product in L2-sized blocks (graph form)
                            measure(row, "preblk", [lambda q=q: kit.pre_blocks(q, validated=True) for q in reqs])
                    if dec:
                        measure(row, "dec", [lambda q=q: dg(q) for q in reqs])
                else:
                    offs = offs_cpu.cuda()
                    reqs = [GroupedGemmRequest(aq, w, offs, (g * w.global_scale).float(), swiglu_limit=limit)
                            for w in ws]
                    reqs[0].validate()   # once with the host reads; the timed calls skip them
                    measure(row, "fp4", [lambda q=q: be.grouped_gemm(q, check_values=False) for q in reqs])
                    measure(row, "fp4_checked", [lambda q=q: be.grouped_gemm(q) for q in reqs], graph=False)
                    row["fp4_eager_checked_us"] = row.pop("fp4_checked_eager_us")
                    row["fp4_route"] = route_of(kit.arch, r, shape.n, shape.k, experts=E)
                    if gen is not None and row["fp4_route"] == "decode":
                        measure(row, "gen", [lambda q=q: gen.grouped_gemm(q, check_values=False) for q in reqs])
                    if dec and kit.grouped_decode:
                        measure(row, "dec", [lambda q=q: dg.grouped(q, check_values=False) for q in reqs])
            except Exception as e:
                row["errors"].append(f"fp4 case: {type(e).__name__}: {str(e)[:300]}")
                torch.cuda.synchronize()
            finally:
                x = aq = reqs = None
    # ---- cuBLAS BF16
    with weights_phase(rows, "bf16") as wbs:
        per = 2 * shape.n * shape.k
        n_copies = copies(per, active_min, E * per)
        shape_ = (E, shape.n, shape.k) if shape.grouped else (shape.n, shape.k)
        wbs += [torch.randn(shape_, device="cuda", dtype=torch.bfloat16) for _ in range(n_copies)]
        for row, (m, offs_cpu, counts, r, _) in zip(rows, todo):
            if row.get("skipped"):
                continue
            try:
                x = torch.randn(r, shape.k, device="cuda", dtype=torch.bfloat16)
                if shape.grouped is None:
                    fns, row["bf16_baseline"] = [lambda w=w: x @ w.t() for w in wbs], "cuBLAS x @ w.t()"
                else:
                    offs = offs_cpu.cuda()
                    made = [nb._bf16_grouped(x, w, offs, offs_cpu, counts, shape.n) for w in wbs]
                    fns, row["bf16_baseline"] = [f for f, _ in made], made[0][1]
                measure(row, "bf16", fns)
            except Exception as e:
                row["errors"].append(f"bf16 case: {type(e).__name__}: {str(e)[:300]}")
                torch.cuda.synchronize()
            finally:
                x = fns = made = None
    return rows


@contextlib.contextmanager
def weights_phase(rows: list[dict], path: str) -> Iterator[list]:
    """One path's weight copies (the list yielded): a failure before or between its cases (the weights
    did not fit, a compile failed) is every row's error, and the copies are freed when the path is done."""
    import torch

    ws: list = []
    try:
        yield ws
    except Exception as e:
        for row in rows:
            row["errors"].append(f"{path} weights: {type(e).__name__}: {str(e)[:300]}")
    finally:
        ws.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ---- output -------------------------------------------------------------------------------------------
PATHS = ("fp4", "dec", "pre")  # the shipped path, the decode kernel, the prefill route


def _us(row: dict, key: str) -> str:
    if f"{key}_graph_us" not in row:
        return "-"
    return f"{row[f'{key}_graph_us']:.1f} / {row.get(f'{key}_eager_us', math.nan):.1f}"


def _pair(row: dict, key: str, fmt: str) -> str:
    return " / ".join("-" if f"{p}_{key}" not in row else fmt.format(row[f"{p}_{key}"]) for p in PATHS)


def _met(row: dict) -> str:
    out = []
    for p in PATHS:
        v = row.get(f"{p}_met", "x")
        out.append("-" if v == "x" or v is None else ("yes" if v else "NO"))
    return " / ".join(out)


def render(rows: list[dict], hbm: dict, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=f"NVFP4 GEMMs at every Flash/Pro shape, {rows[0]['device'] if rows else ''} "
                    f"(us: kernel-only graph / eager; roofline at {hbm['roofline'] / 1e9:.0f} GB/s)")
    for c in ("model", "shape", "n x k", "M", "fp4 us", "decode us", "generic us", "prefill us", "bf16 us",
              "x bf16 fp4/dec/pre", "% roof fp4/dec/pre", "target fp4/dec/pre", "errors"):
        t.add_column(c, justify="left" if c in ("model", "shape", "errors") else "right")
    for r in rows:
        g = r["grouped"]
        extra = (f" ({g[0]}e top-{g[1]}, {r['active']} active)" if g and g[1] else
                 f" ({g[0]} groups)" if g else "") + (" swiglu" if r["swiglu"] else "")
        t.add_row(r["model"], escape(r["shape"] + extra), f"{r['n']}x{r['k']}", str(r["m"]), _us(r, "fp4"), _us(r, "dec"),
                  _us(r, "gen"), _us(r, "pre"), _us(r, "bf16"), _pair(r, "x_bf16", "{:.2f}x"), _pair(r, "roof", "{:.0%}"), _met(r),
                  str(len(r["errors"])) if r["errors"] else "")
    console.print(t)
    for p, label in (("fp4", "shipped backend"), ("dec", "DecodeGemm"), ("pre", "PrefillGemm")):
        judged = [r for r in rows if r.get(f"{p}_met") is not None]
        log(f"{label}: targets met in {sum(bool(r[f'{p}_met']) for r in judged)} of {len(judged)} rows")
    for route, kernel in (("decode", "the decode kernel"), ("prefill", "PrefillGemm")):
        routed = [r for r in rows if r.get("fp4_route") == route and not math.isnan(r.get("gen_graph_us", math.nan))]
        faster = [r for r in routed if r["fp4_graph_us"] < r["gen_graph_us"]]
        log(f"routed to {kernel}: faster than the generic kernel (kernel-only) in {len(faster)} of "
            f"{len(routed)} rows; slower: " + ", ".join(f"{r['model']} {r['shape']} M={r['m']} "
                                                      f"{r['fp4_graph_us']:.1f} vs {r['gen_graph_us']:.1f} us"
                                                      for r in routed if r not in faster))
    blk = [r for r in rows if "preblk_graph_us" in r and "pre_graph_us" in r]
    if blk:
        faster = [r for r in blk if r["preblk_graph_us"] < r["pre_graph_us"]]
        top = max(r["m"] for r in blk)
        log(f"PrefillGemm with L2-sized FP32 blocks (kernel-only): faster in {len(faster)} of {len(blk)} rows; "
            + ", ".join(f"{r['model']} {r['shape']} M={r['m']} {r['preblk_graph_us']:.1f} vs {r['pre_graph_us']:.1f} us"
                        for r in blk if r["m"] == top))
    # where the rule kept the generic kernel, would PrefillGemm have been faster?
    kept = [r for r in rows if r.get("fp4_route") == "generic" and not math.isnan(r.get("pre_graph_us", math.nan))]
    missed = [r for r in kept if r["pre_graph_us"] < r["fp4_graph_us"]]
    log(f"kept on the generic kernel with PrefillGemm timed: PrefillGemm faster in {len(missed)} of {len(kept)} rows"
        + (": " + ", ".join(f"{r['model']} {r['shape']} M={r['m']} {r['pre_graph_us']:.1f} vs "
                            f"{r['fp4_graph_us']:.1f} us" for r in missed) if missed else ""))


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    args = parse_args(argv)
    import torch

    from nvfp4_arch_kernels import for_this_gpu

    kit = for_this_gpu()
    if kit is None:
        log(NEEDS)
        return 2
    from bench_sm90_decode_gemm import ERRORS, measure_hbm
    from nvfp4_shapes import model_config, gemm_shapes

    from parity.console import make_console

    t0 = time.time()
    deadline = t0 + args.budget_s
    torch.manual_seed(0)
    device = torch.cuda.get_device_name()
    hbm = measure_hbm()
    log(f"{device}: HBM read {hbm['read_reduce'] / 1e9:.0f} GB/s, copy {hbm['d2d_copy'] / 1e9:.0f} GB/s")
    shapes = [s for m in args.model_list for s in gemm_shapes(model_config(m), m)]
    path = args.json or (str(Path(os.environ["OUT"]) / "bench_nvfp4_shapes.json") if os.environ.get("OUT") else None)
    rows: list[dict] = []
    skipped: list[str] = []

    def dump() -> None:
        if path:
            Path(path).write_text(json.dumps(
                {"bench": "nvfp4_shapes", "device": device, "arch": kit.arch, "hbm": hbm, "models": list(args.model_list),
                 "ms": args.m_list, "budget_s": args.budget_s, "seconds": time.time() - t0,
                 "shapes": [s.to_dict() for s in shapes], "rows": rows, "skipped": skipped,
                 "errors": ERRORS}, indent=1, default=str))

    # decode sizes of every shape first: the targets that matter most survive a short budget
    for phase in ([m for m in args.m_list if m <= DECODE_MAX], [m for m in args.m_list if m > DECODE_MAX]):
        for s in shapes if phase else []:
            try:
                new = run_shape(kit, s, phase, deadline, skipped)
            except Exception as e:  # never end the run on one shape
                new = [{"model": s.model, "shape": s.name, "m": m, "errors": [f"{type(e).__name__}: {e}"[:300]]}
                       for m in phase]
            for r in new:
                r["device"] = device
                if "io_bytes" in r and not r.get("skipped"):
                    finish(r, hbm["roofline"])
                rows.append(r)
                if r.get("skipped"):
                    continue
                log(f"{s.model} {s.name} M={r['m']}: fp4 {_us(r, 'fp4')} us ({r.get('fp4_route')}), decode "
                    f"{_us(r, 'dec')} us, generic {_us(r, 'gen')} us, prefill {_us(r, 'pre')} us, "
                    f"bf16 {_us(r, 'bf16')} us, x bf16 {_pair(r, 'x_bf16', '{:.2f}')}, roof {_pair(r, 'roof', '{:.0%}')}"
                    f"{'  errors: ' + '; '.join(r['errors'])[:300] if r['errors'] else ''} [{time.time() - t0:.0f} s]")
            dump()
    render([r for r in rows if "io_bytes" in r and not r.get("skipped")], hbm, make_console())
    for r in rows:
        for e in r["errors"]:
            log(f"error: {r['model']} {r['shape']} M={r['m']}: {e}")
    if skipped:
        log(f"skipped (budget {args.budget_s:.0f} s): {skipped}")
    dump()
    if path:
        log(f"wrote {path}")
    return 0 if not any(r["errors"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
