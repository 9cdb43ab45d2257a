"""Do processes sharing one GPU slow each other's kernel launches? (Why DSpark draft parity spreads its
units over torchrun ranks on one GPU: parity/dspark/sharded.py.)

N processes (1, 2, 4, 8 by default) each launch ``--ops`` tiny in-place adds on their own CUDA tensor
and report microseconds per launch; the table gives each process's figure per N, side by side in one
run. Measured on an H100 80GB (2026-12-06): 8.3 us alone, 8.0-12.2 us each with 8 processes.

    python benchmarks/bench_launch_sharing.py [--procs 1,2,4,8] [--ops 20000] [--json F]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _one(n_ops: int) -> float:
    import torch

    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n_ops):
        x.add_(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n_ops * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", default="1,2,4,8", help="comma-separated process counts")
    p.add_argument("--ops", type=int, default=20000, help="launches per process")
    p.add_argument("--json", default=None, help="write the table as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        print(json.dumps({"us_per_launch": _one(a.ops)}), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_launch_sharing: needs a CUDA GPU; none is present on this machine", file=sys.stderr)
        return 2
    try:
        counts = [int(v) for v in a.procs.split(",")]
    except ValueError:
        p.error(f"--procs: expected comma-separated ints, found {a.procs!r}")
    rows = []
    for n in counts:
        ps = [subprocess.Popen([sys.executable, __file__, "--worker", "--ops", str(a.ops)], stdout=subprocess.PIPE,
                               text=True) for _ in range(n)]
        each = [json.loads(q.communicate()[0].strip().splitlines()[-1])["us_per_launch"] for q in ps]
        rows.append({"procs": n, "us_per_launch": [round(v, 2) for v in each]})
        print(f"{n:>2} processes: us per launch, each: {', '.join(f'{v:.1f}' for v in each)}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "ops": a.ops, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
