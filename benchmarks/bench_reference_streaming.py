"""Peak host memory of the streaming reference: 4-layer vs 16-layer synthetic models.

The reference reads each layer's weights through the lazy reader and drops them after the layer,
so peak memory should not grow with depth: the goal is growth from 4 to 16 layers of less than one
layer's stored size. Each model runs a short prefill in a fresh subprocess; peak memory is that
process's ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (peak resident set, includes the Python and
torch baseline, which is the same for both models). Assert-free: prints a table.

    python benchmarks/bench_reference_streaming.py [--tokens 32] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# FP8 non-expert linears and FP8 experts (Flash-Base layout): ~66 MB stored per layer, fast to encode.
CONFIG = dict(vocab_size=1024, hidden_size=1024, num_attention_heads=8, head_dim=128, qk_rope_head_dim=64,
              q_lora_rank=256, o_lora_rank=256, o_groups=2, index_n_heads=4, index_head_dim=128, index_topk=4,
              sliding_window=16, csa_ratio=4, hca_ratio=16, max_position_embeddings=4096, n_routed_experts=20,
              num_experts_per_tok=2, moe_intermediate_size=1024, num_hash_layers=1, dtype="fp8",
              expert_dtype="fp8", num_nextn_predict_layers=0)

# Each step runs in its own interpreter, started from this torch-free parent: on Linux ru_maxrss
# survives exec and starts at the parent's resident size at fork time, so the parent stays small.
BUILD = r"""
import sys
from dsv4.checkpoint.synth import synth
from dsv4.config import DSV4Config
out, layers, config = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
ratios = tuple([0, 4, 16, 4][i % 4] for i in range(layers))
cfg = DSV4Config(name=f"stream-{layers}", num_hidden_layers=layers, compress_ratios=ratios, **config)
synth(out=out, flavor="official", config=cfg, seed=0)
"""

MEASURE = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
import reference
from dsv4.checkpoint.reader import open_checkpoint
path, tokens = sys.argv[1], int(sys.argv[2])
r = open_checkpoint(path)
size = {"F32": 4, "I64": 8, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "U8": 1, "I8": 1}
layer1 = 0
for name in r.tensor_names():
    if name.startswith("layers.1."):
        info = r.tensor_info(name)
        layer1 += size[info.dtype] * int(torch.tensor(info.shape).prod()) if info.shape else size[info.dtype]
del r
m = reference.load_model(path, cache_weights=False)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ids = torch.randint(0, m.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0))
t0 = time.perf_counter()
logits = m(ids)
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak_kb": peak, "before_kb": before, "seconds": dt, "layer_bytes": layer1,
                  "finite": bool(torch.isfinite(logits).all())}))
"""


def run(script: str, *args: str) -> str:
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"subprocess failed:\n{out.stderr[-4000:]}")
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--keep", default=None, help="build the checkpoints here (and keep them)")
    a = ap.parse_args()
    base = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="dsv4-stream-"))
    rows = []
    for layers in (4, 16):
        t0 = time.perf_counter()
        path = base / f"stream-{layers}"
        if not (path / "config.json").exists():
            run(BUILD, str(path), str(layers), repr(CONFIG))
        built = time.perf_counter() - t0
        ckpt = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        res = json.loads(run(MEASURE, str(path), str(a.tokens)).strip().splitlines()[-1])
        rows.append((layers, res["layer_bytes"], ckpt, res, built))
    mb = 1 / (1024 * 1024)
    print(f"prefill of {a.tokens} tokens, peak = ru_maxrss of a fresh subprocess per model (cache_weights=False)")
    print(f"{'layers':>6} {'layer MB':>9} {'ckpt MB':>9} {'RSS after load MB':>18} {'peak RSS MB':>12} "
          f"{'prefill s':>10} {'finite':>7}")
    for layers, lb, ck, res, _ in rows:
        print(f"{layers:>6} {lb * mb:>9.1f} {ck * mb:>9.1f} {res['before_kb'] / 1024:>18.1f} "
              f"{res['peak_kb'] / 1024:>12.1f} {res['seconds']:>10.2f} {str(res['finite']):>7}")
    growth = (rows[1][3]["peak_kb"] - rows[0][3]["peak_kb"]) / 1024
    layer_mb = rows[1][1] * mb
    print(f"peak growth 4 -> 16 layers: {growth:.1f} MB = {growth / layer_mb:.2f} x one layer ({layer_mb:.1f} MB); "
          f"checkpoint grew {(rows[1][2] - rows[0][2]) * mb:.1f} MB")


if __name__ == "__main__":
    main()
