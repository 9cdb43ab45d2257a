"""Loading one routed-expert bank (w1; w3 per expert, NVFP4 as stored) from a safetensors file, two ways
side by side in one run, each in a fresh process so peaks do not mix:

* ``stack``: every expert's stored tensors read first, each group prepared, then ``weights.stack_bank``
  (how ``dsv4.model`` built banks before ``bank_fill.py``);
* ``fill``: ``weights.prepare_bank`` with each expert read when its turn comes and written into a bank
  allocated once (``bank_fill.BankFill``).

Per way: wall seconds, peak host RSS growth (the peak during the load, ``VmHWM`` reset before it,
minus the RSS before),
peak device memory on a GPU (``torch.cuda.max_memory_allocated``), and that the two banks are equal.

    python benchmarks/bench_bank_load.py [--experts 256 --n 2048 --k 4096] [--device cuda] [--json F]

The default shape is a DeepSeek-V4 Flash routed w13 bank (256 experts, 2 x 2048 rows, K = 4096: 2.4 GB).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_bank(path: Path, experts: int, n: int, k: int) -> None:
    """Random NVFP4 bytes in the stored layout: packed [n, k/2] uint8, E4M3 scales [n, k/16], FP32 global."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    t = {}
    for e in range(experts):
        for w in ("w1", "w3"):
            t[f"experts.{e}.{w}.weight"] = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
            t[f"experts.{e}.{w}.weight_scale"] = (torch.rand(n, k // 16, generator=g) * 4 + 0.5).to(torch.float8_e4m3fn)
            t[f"experts.{e}.{w}.weight_scale_2"] = torch.tensor(0.01, dtype=torch.float32)
    save_file(t, str(path))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _rss_now() -> int:
    return _status_kib("VmRSS") * 1024


def _reset_peak_rss() -> None:
    """Linux: writing 5 to clear_refs resets the peak (VmHWM) to the current RSS, so the peak after the
    load is the load's own, not an earlier transient's (``ru_maxrss`` cannot be reset)."""
    Path("/proc/self/clear_refs").write_text("5\n")


def _peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def load_once(path: str, way: str, device: str, experts: int) -> dict:
    """One way, in this process; returns its measurements and a digest of the bank."""
    import torch
    from safetensors import safe_open

    sys.path.insert(0, str(ROOT))
    from dsv4.checkpoint.formats import NVFP4, StoredWeight, WeightFormat
    from dsv4.weights import ConversionRecord, prepare, prepare_bank, stack_bank

    h = safe_open(path, framework="pt", device="cpu")
    dev = torch.device(device)

    def read(e: int) -> list[StoredWeight]:
        out = []
        for w in ("w1", "w3"):
            ts = {r: h.get_tensor(f"experts.{e}.{w}.{r}") for r in ("weight", "weight_scale", "weight_scale_2")}
            ts["weight_scale_2"] = ts["weight_scale_2"].reshape(())
            n, half = ts["weight"].shape
            out.append(StoredWeight(ts, WeightFormat(NVFP4, (n, 2 * half), "uint8", (1, 16), "float8_e4m3fn")))
        return out

    recs: list[ConversionRecord] = []
    kw = dict(name="bank", component="routed_experts", records=recs, device=dev)
    rss0 = _rss_now()
    _reset_peak_rss()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    if way == "stack":
        groups = [read(e) for e in range(experts)]
        bank = stack_bank([prepare(g, "fp4", **kw) for g in groups])
        del groups
    else:
        bank = prepare_bank([lambda e=e: read(e) for e in range(experts)], "fp4", **kw)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - t0
    rss1 = _peak_rss()
    bank_bytes = sum(t.numel() * t.element_size() for t in (bank.packed, bank.scales, bank.global_scale))
    digest = [int(bank.packed.to(torch.int64).sum()), int(bank.scales.view(torch.uint8).to(torch.int64).sum()),
              float(bank.global_scale.double().sum())]
    return {"way": way, "seconds": seconds, "host_peak_growth_bytes": rss1 - rss0, "bank_bytes": bank_bytes,
            "peak_device_bytes": torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None,
            "gb_per_s": bank_bytes / seconds / 1e9, "digest": digest}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--n", type=int, default=2048, help="rows of w1 (and of w3)")
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--repeat", type=int, default=2, help="fresh processes per way, alternating")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.k % 32 or a.n < 1 or a.experts < 1:
        p.error(f"expected --k a multiple of 32 and positive --n/--experts, found k={a.k} n={a.n} "
                f"experts={a.experts}")
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a._child:
        print(json.dumps(load_once(a._child[0], a._child[1], device, a.experts)))
        return 0
    with tempfile.TemporaryDirectory(dir=a.workdir) as tmp:
        path = Path(tmp) / "bank.safetensors"
        t0 = time.perf_counter()
        write_bank(path, a.experts, a.n, a.k)
        print(f"wrote {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        runs = []
        for r in range(a.repeat):
            for way in ("stack", "fill"):
                cmd = [sys.executable, __file__, "--experts", str(a.experts), "--device", device,
                       "--_child", str(path), way]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                x = runs[-1]
                dev = "-" if x["peak_device_bytes"] is None else f"{x['peak_device_bytes'] / 2**30:.2f} GiB"
                print(f"{way:5s} run {r}: {x['seconds']:6.2f} s  {x['gb_per_s']:5.2f} GB/s  host peak growth "
                      f"{x['host_peak_growth_bytes'] / 2**30:5.2f} GiB  device peak {dev}", file=sys.stderr)
    equal = len({json.dumps(x["digest"]) for x in runs}) == 1
    best = {w: min((x for x in runs if x["way"] == w), key=lambda x: x["seconds"]) for w in ("stack", "fill")}
    res = {"bench": "bank_load", "device": device,
           "card": torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "shape": {"experts": a.experts, "n": a.n, "k": a.k}, "runs": runs, "banks_equal": equal,
           "fill_over_stack_seconds": best["fill"]["seconds"] / best["stack"]["seconds"],
           "fill_over_stack_host_peak": (best["fill"]["host_peak_growth_bytes"]
                                         / max(best["stack"]["host_peak_growth_bytes"], 1))}
    if device == "cuda":
        res["fill_over_stack_device_peak"] = best["fill"]["peak_device_bytes"] / best["stack"]["peak_device_bytes"]
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
