"""The kernel audit's cost, as ratios measured side by side in one run.

    python benchmarks/bench_audit.py [--checkpoint tiny] [--backend auto] [--plan default] [--repeat 3]

On the same prompts and the same prebuilt models, times (minimum over ``--repeat`` runs; the machine is
shared and the minimum is the least disturbed measurement):

* the plain forward on the kernel backend (``--backend``; ``auto`` = the device's best kernel backend,
  or on a CPU the bug zoo's clean stand-in, a copy of ``emulated``),
* the same forward with every kernel call audited (``CallAuditor``: replay through the oracle + bounds),
* the plain forward of the same plan on ``emulated`` (what the audit replays),
* the weight audit of the model (once per bug-budget column).

Prints audited / plain and audited / emulated (aim: audit overhead <= 1.5x the emulated forward it
replays) and the audit's verdict (0 violations expected on a correct backend).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dsv4.model import load_model  # noqa: E402
from parity.audit import CallAuditor, audit_weights  # noqa: E402
from parity.bugzoo.backends import CLEAN_KERNEL, installed  # noqa: E402
from parity.cli import set_threads  # noqa: E402
from parity.inputs import encode_prompts, select_prompts  # noqa: E402
from parity.source import resolve_checkpoint  # noqa: E402
from parity.threeway import resolve_kernel_backend  # noqa: E402


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeat: int, device: str) -> float:
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="tiny")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--plan", default="default")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--mode", default="chat")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the figures as JSON here (card named)")
    args = ap.parse_args()
    src = resolve_checkpoint(args.checkpoint, 0)
    set_threads(None, args.device, src.config)
    prompts = encode_prompts(select_prompts(args.mode, None, None), src.tokenizer, src.config.vocab_size)
    kernel = args.backend if args.backend != "auto" else resolve_kernel_backend("auto", args.device)[0]
    with installed(CLEAN_KERNEL) as stand_in:
        name = kernel or stand_in
        model = load_model(str(src.path), plan=args.plan, backend=name, device=args.device)
        emulated = load_model(str(src.path), plan=args.plan, backend="emulated", device=args.device)
        ids = [p.tensor().to(args.device) for p in prompts]

        def run(m):
            with torch.no_grad():
                for x in ids:
                    m(x)

        run(model), run(emulated)                       # warm-up (compiles kernels once)
        plain = timed(lambda: run(model), args.repeat, args.device)
        emu = timed(lambda: run(emulated), args.repeat, args.device)
        auditor = CallAuditor()

        def audited() -> None:
            with auditor.attached(model):
                run(model)

        aud = timed(audited, args.repeat, args.device)
        t0 = time.perf_counter()
        wa = audit_weights(model)
        _sync(args.device)
        weights = time.perf_counter() - t0
    tokens = sum(int(x.numel()) for x in ids)
    print(f"bench_audit: {src.config_name}, plan {args.plan}, backend {name} on {args.device}, "
          f"{len(ids)} prompts / {tokens} tokens, min of {args.repeat}")
    print(f"  plain kernel forward     {plain * 1e3:9.1f} ms")
    print(f"  emulated forward         {emu * 1e3:9.1f} ms")
    print(f"  audited kernel forward   {aud * 1e3:9.1f} ms   audited / plain = {aud / plain:.2f}x, "
          f"audit overhead / emulated = {(aud - plain) / emu:.2f}x (aim <= 1.5x)")
    print(f"  weight audit             {weights * 1e3:9.1f} ms   ({wa.modules} modules, {wa.weights:,} weights)")
    s = auditor.summary()
    print(f"  verdict: {s['calls']} calls audited ({args.repeat} runs), {s['violating_calls']} violating, worst "
          f"{s['worst_ratio']:.3g} bounds; weights {'exact' if wa.passed else 'MISMATCH'}")
    if args.json:
        from parity.env import device_name
        from parity.records import atomic_write_json

        atomic_write_json(args.json, {
            "checkpoint": src.config_name, "plan": args.plan, "backend": name, "device": device_name(args.device),
            "prompts": len(ids), "tokens": tokens, "repeat": args.repeat, "seconds": {
                "plain": plain, "emulated": emu, "audited": aud, "weight_audit": weights},
            "audited_over_plain": aud / plain, "audit_overhead_over_emulated": (aud - plain) / emu,
            "calls": s["calls"], "violating_calls": s["violating_calls"], "weights_exact": wa.passed})
    return 0 if auditor.passed and wa.passed else 1


if __name__ == "__main__":
    sys.exit(main())
