"""A streamed native model (``dsv4.streamed``) beside the model built whole, in one run on one device:

* ``prefill``: a forward of the whole model, and of the streamed one at a zero resident budget (every
  layer built again in the forward), each the best of ``--repeat``;
* ``decode``: a teacher-forced decode of ``--steps`` steps on the streamed model step by step
  (``run_steps``: each step builds every layer) and layer by layer (``dsv4.decode.layer_major``: each
  layer built once), and on the whole model step by step; logits compared.

Per row: seconds, layer builds, bytes built. The ratio that matters is the streamed time over the whole
model's: what re-reading the checkpoint costs on this machine (from its page cache, after the first).

    python benchmarks/bench_streamed.py [--preset tiny-deep] [--device cpu|cuda] [--backend emulated]
                                        [--steps 32] [--repeat 3] [--json F]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-deep")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="emulated")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.steps < 2 or args.repeat < 1 or args.tokens < 1:
        ap.error(f"expected --steps >= 2, --repeat >= 1, --tokens >= 1, found {args.steps}, {args.repeat}, "
                 f"{args.tokens}")
    sys.path.insert(0, str(ROOT))
    import torch

    import dsv4
    from dsv4.decode.layer_major import run_steps_layer_major
    from dsv4.decode.loop import run_steps
    from dsv4.streamed import load_streamed_model

    def sync() -> None:
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize()

    def timed(fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        return out, time.perf_counter() - t0

    kw = dict(backend=args.backend, device=args.device)
    whole = dsv4.load_model(args.preset, **kw)
    streamed = load_streamed_model(args.preset, resident_bytes=0, **kw)
    c = whole.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, c.vocab_size, (args.tokens,), generator=g)
    forced = torch.randint(0, c.vocab_size, (args.steps,), generator=g).tolist()
    dev_ids = ids.to(args.device)
    rows = []
    with torch.no_grad():
        want, _ = timed(lambda: whole(dev_ids))            # warm-up of both (compiles, first builds)
        got, _ = timed(lambda: streamed(dev_ids))
        equal = bool(torch.equal(want, got))
        for name, m in (("whole", whole), ("streamed", streamed)):
            b0 = getattr(m.blocks, "builds", 0)
            best = min(timed(lambda: m(dev_ids))[1] for _ in range(args.repeat))
            builds = (getattr(m.blocks, "builds", 0) - b0) // args.repeat
            rows.append({"run": "prefill", "model": name, "tokens": args.tokens, "seconds": best,
                         "layer_builds": builds})
            print(f"prefill {name:9s} {best:8.3f} s  layer builds {builds}", flush=True)
        logits = {}
        for name, m, fn in (("whole step by step", whole, run_steps),
                            ("streamed step by step", streamed, run_steps),
                            ("streamed layer by layer", streamed, run_steps_layer_major)):
            b0 = getattr(m.blocks, "builds", 0)
            if fn is run_steps:
                steps, secs = timed(lambda: list(fn(m, ids, args.steps, forced=forced)))
            else:
                steps, secs = timed(lambda: list(fn(m, ids, args.steps, forced)))
            logits[name] = torch.stack([s.logits for s in steps])
            builds = getattr(m.blocks, "builds", 0) - b0
            rows.append({"run": "decode", "model": name, "tokens": args.tokens, "steps": args.steps,
                         "seconds": secs, "layer_builds": builds})
            print(f"decode  {name:24s} {secs:8.3f} s  layer builds {builds}", flush=True)
    ref = logits["whole step by step"]
    equal_decode = {k: bool(torch.equal(v, ref)) for k, v in logits.items()}
    card = torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    out = {"bench": "streamed", "card": card, "device": args.device, "backend": args.backend, "preset": args.preset,
           "layers": c.num_hidden_layers, "torch": torch.__version__, "prefill_logits_equal": equal,
           "decode_logits_equal": equal_decode, "rows": rows,
           "ratios": {"prefill streamed / whole": rows[1]["seconds"] / rows[0]["seconds"],
                      "decode streamed step by step / layer by layer": rows[3]["seconds"] / rows[4]["seconds"],
                      "decode streamed layer by layer / whole": rows[4]["seconds"] / rows[2]["seconds"]}}
    for k, v in out["ratios"].items():
        print(f"{k}: {v:.2f}x")
    print(f"logits equal: prefill {equal}, decode {equal_decode}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0 if equal and all(equal_decode.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
