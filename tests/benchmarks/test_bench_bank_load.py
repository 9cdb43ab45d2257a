"""benchmarks/bench_bank_load.py at a tiny shape on the CPU: both ways run in their own processes and
build the same bank; a bad shape is one clear error before anything is written."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_bank_load.py"


def test_both_ways_build_the_same_bank(tmp_path) -> None:
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(BENCH), "--experts", "6", "--n", "64", "--k", "128", "--device", "cpu",
                        "--repeat", "1", "--workdir", str(tmp_path), "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["banks_equal"] and {x["way"] for x in d["runs"]} == {"stack", "fill"}
    assert all(x["bank_bytes"] == 6 * 2 * 64 * (64 + 8) + 6 * 4 for x in d["runs"])   # packed + scales + globals
    assert d["fill_over_stack_seconds"] > 0


def test_bad_shape_is_one_clear_error(tmp_path) -> None:
    r = subprocess.run([sys.executable, str(BENCH), "--k", "100", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "expected --k a multiple of 32" in r.stderr and "found k=100" in r.stderr
    assert not list(tmp_path.iterdir())
