"""Every CLI answers --help without importing torch, pandas, numpy or safetensors (the imports that
make a help page take seconds). Counted in a fresh interpreter, not timed: machines are noisy."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

CLIS = ["parity.first_token", "parity.bugzoo", "parity.audit", "parity.check", "parity.decode",
        "parity.compare_dumps", "parity.dumps", "parity.calibrate", "parity.dspark", "parity.pipeline",
        "precision_floor.flips", "precision_floor.search", "precision_floor.draft_floor", "precision_floor.report",
        "precision_floor.attribution",
        "dsv4.checkpoint.synth", "dsv4.checkpoint.verify", "dsv4.checkpoint.sparse",
        "dsv4.kernels.compile_check", "dsv4.decode.readiness", "dsv4.checkpoint.convert",
        "parity.engines.module_tree", "reference.training", "reference.training.draft"]
HEAVY = ("torch", "pandas", "numpy", "safetensors", "cutlass")

PROBE = """
import contextlib, io, json, runpy, sys
mod = sys.argv[1]
sys.argv = [mod, "--help"]
out = io.StringIO()
code = None
try:
    with contextlib.redirect_stdout(out):
        runpy.run_module(mod, run_name="__main__", alter_sys=True)
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "help": out.getvalue()[:200],
                  "heavy": sorted(m for m in sys.modules if m.split('.')[0] in %r)}))
""" % (HEAVY,)


@pytest.mark.parametrize("module", CLIS)
def test_help_imports_no_heavy_module(module):
    r = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, timeout=120)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["code"] in (0, None) and "usage:" in got["help"], (module, r.stderr[-500:])
    assert {m.split(".")[0] for m in got["heavy"]} == set(), (module, got["heavy"][:10])
