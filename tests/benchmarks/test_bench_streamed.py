"""benchmarks/bench_streamed.py runs side by side and writes what it measured: the streamed model's
layer builds (every layer a forward; once for a layer-major decode, once a step step by step) and equal
logits everywhere."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_streamed.py"


def test_bench_streamed_counts_builds_and_checks_logits(tmp_path) -> None:
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(BENCH), "--preset", "tiny", "--tokens", "8", "--steps", "3",
                        "--repeat", "1", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    L = d["layers"]
    builds = {(x["run"], x["model"]): x["layer_builds"] for x in d["rows"]}
    assert builds[("prefill", "whole")] == 0 and builds[("prefill", "streamed")] == L
    assert builds[("decode", "streamed step by step")] == 3 * L and builds[("decode", "streamed layer by layer")] == L
    assert d["prefill_logits_equal"] and all(d["decode_logits_equal"].values())
    assert set(d["ratios"]) == {"prefill streamed / whole", "decode streamed step by step / layer by layer",
                                "decode streamed layer by layer / whole"}


def test_bad_arguments_are_one_clear_error() -> None:
    r = subprocess.run([sys.executable, str(BENCH), "--steps", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "expected --steps >= 2" in r.stderr
