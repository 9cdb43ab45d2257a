"""Harness overhead: what probes and metrics add to the forwards a parity run performs.

    python benchmarks/bench_harness_overhead.py [--checkpoint tiny] [--mode chat] [--repeat 3] [--cli-runs 3]

1. Builds the three models once (timed) and measures every forward the default run performs with no
   probe recorder active: the reference prefill per prompt, and per native column (all-bf16 logic,
   default-plan floor) a propagated prefill and an isolated layer-by-layer pass fed the reference's
   layer inputs.
2. Runs the harness itself (``run_threeway``) on the same prebuilt models: the same forwards with
   every probe captured, plus every metric and record.
3. Overhead = harness time / plain forward time - 1, split into probe capture (harness forwards minus
   plain forwards) and metrics + records (the rest). Target: <= 25 %.
4. Optionally times the default CLI end to end (``python -m parity.first_token --mode chat``), model
   build and imports included. Target on tiny: <= 15 s on the 2-core CI machine.

Every timing is the minimum over ``--repeat`` runs: the machine is shared, and the minimum is the
least disturbed measurement.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4.plan import PrecisionPlan  # noqa: E402
from dsv4.probes import suspended  # noqa: E402
from parity.cli import set_threads  # noqa: E402
from parity.inputs import encode_prompts, select_prompts  # noqa: E402
from parity.runner import DefaultLoaders, run_propagated  # noqa: E402
from parity.source import resolve_checkpoint  # noqa: E402
from parity.threeway import RunSpec, run_threeway  # noqa: E402


class Prebuilt:
    """Loaders handing out models built beforehand, so the harness timing excludes model builds."""

    def __init__(self, ref: Any, natives: dict[str, Any]) -> None:
        self.ref, self.natives = ref, natives

    def reference(self, path: str, **kw: Any) -> Any:
        return self.ref

    def native(self, path: str, *, plan: Any, **kw: Any) -> Any:
        return self.natives[plan.name]


def _best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _isolated_plain(model: Any, ids: torch.Tensor, anchor: Any, n_layers: int) -> None:
    with torch.no_grad(), suspended():
        state = model.new_state(ids)
        model.embed(ids)
        for i in range(n_layers):
            model.layer(i, anchor.layer_input(i), state)
        model.head(anchor.probes[f"layers.{n_layers - 1}.out"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--mode", default="chat")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cli-runs", type=int, default=3)
    args = ap.parse_args()
    con = Console()
    gc.freeze()   # as parity.cli.run_cli does for every CLI run
    src = resolve_checkpoint(args.checkpoint)
    set_threads(None, "cpu", src.config)
    prompts = encode_prompts(select_prompts(args.mode), src.tokenizer, src.config.vocab_size)
    L = src.config.num_hidden_layers
    loaders = DefaultLoaders()

    builds: dict[str, float] = {}
    t0 = time.perf_counter()
    ref = loaders.reference(str(src.path), profile="bf16", dtype=torch.bfloat16, device="cpu", device_map=None)
    builds["reference:bf16"] = time.perf_counter() - t0
    natives = {}
    for plan in ("all-bf16", "default"):
        t0 = time.perf_counter()
        natives[plan] = loaders.native(str(src.path), plan=PrecisionPlan.preset(plan), backend="emulated",
                                       device="cpu", device_map=None)
        builds[f"native:{plan}"] = time.perf_counter() - t0
    for m in (ref, *natives.values()):   # warm-up: first calls dequantize / allocate
        with torch.no_grad(), suspended():
            m(prompts[0].tensor())

    anchors = {p.id: run_propagated(ref, p.tensor()) for p in prompts}
    plan_of = [("reference:bf16", ref, "propagated")] + [
        (f"native:{plan}", m, mode) for plan, m in natives.items() for mode in ("propagated", "isolated")]

    def plain_pass() -> dict[tuple[str, str, str], float]:
        out = {}
        for p in prompts:
            ids = p.tensor()
            for label, m, mode in plan_of:
                t0 = time.perf_counter()
                if mode == "isolated":
                    _isolated_plain(m, ids, anchors[p.id], L)
                else:
                    with torch.no_grad(), suspended():
                        m(ids)
                out[(label, p.id, mode)] = time.perf_counter() - t0
        return out

    # Plain and harness passes alternate, so both see the same load on the shared machine.
    spec_kw = dict(source=src, prompts=prompts, plan=PrecisionPlan.preset("default"), columns=("logic", "floor"))
    plain_runs, harness, fwd_in_harness = [], [], []
    for _ in range(args.repeat):
        plain_runs.append(plain_pass())
        t0 = time.perf_counter()
        res = run_threeway(RunSpec(**spec_kw), Prebuilt(ref, natives))
        harness.append(time.perf_counter() - t0)
        fwd_in_harness.append(sum(f.seconds for f in res.forwards))
    tokens = {p.id: p.n_tokens for p in prompts}
    rows = [(k[0], k[1], k[2], tokens[k[1]], min(r[k] for r in plain_runs)) for k in plain_runs[0]]
    plain_total = min(sum(r.values()) for r in plain_runs)
    best = min(range(args.repeat), key=lambda i: harness[i])
    h, hf = harness[best], fwd_in_harness[best]

    t = Table(title=f"every forward of the default run (no probes), min of {args.repeat}; torch threads "
                    f"{torch.get_num_threads()}", title_justify="left")
    for c in ("model", "prompt", "mode", "tokens", "ms"):
        t.add_column(c, justify="right" if c in ("tokens", "ms") else "left")
    for r in rows:
        t.add_row(r[0], r[1], r[2], str(r[3]), f"{r[4] * 1e3:.1f}")
    con.print(t)
    s = Table(title="summary", title_justify="left")
    s.add_column("quantity")
    s.add_column("value", justify="right")
    for k, v in builds.items():
        s.add_row(f"build {k}", f"{v:.2f} s")
    s.add_row(f"plain forwards, sum (best of {args.repeat} passes)", f"{plain_total:.3f} s")
    s.add_row("harness run (same forwards + probes + metrics + records)", f"{h:.3f} s")
    s.add_row("  of which forwards with probes captured", f"{hf:.3f} s")
    s.add_row("  of which metrics + records", f"{h - hf:.3f} s")
    s.add_row("overhead: probe capture", f"{(hf / plain_total - 1) * 100:+.1f} %")
    s.add_row("overhead: metrics + records", f"{(h - hf) / plain_total * 100:+.1f} %")
    s.add_row("overhead: total (target <= 25 %)", f"{(h / plain_total - 1) * 100:+.1f} %")
    s.add_row("records per run", str(len(res.records)))
    if args.cli_runs:
        walls = []
        for _ in range(args.cli_runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "parity.first_token", "--mode", args.mode, "--checkpoint",
                            args.checkpoint], check=False, capture_output=True,
                           cwd=Path(__file__).resolve().parent.parent)
            walls.append(time.perf_counter() - t0)
        s.add_row(f"CLI wall, {args.cli_runs} runs: min / median (target <= 15 s)",
                  f"{min(walls):.2f} / {statistics.median(walls):.2f} s")
    con.print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
