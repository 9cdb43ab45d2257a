"""Design principle 2: the reference runs without importing the native model's compute modules."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("dsv4.numerics", "dsv4.layers", "dsv4.kernels", "dsv4.model")
ALLOWED = ("dsv4.config", "dsv4.checkpoint", "dsv4.probes", "dsv4.encoding", "dsv4.tokenizer")

SCRIPT = f"""
import sys, torch
torch.set_num_threads(1)
import reference
m = reference.load_model("tiny", profile="official")
logits = m(torch.arange(40) % 512)
assert logits.shape == (40, 512) and bool(torch.isfinite(logits).all())
bad = sorted(n for n in sys.modules if n.startswith({FORBIDDEN!r}))
print("FORBIDDEN:" + ",".join(bad))
"""


def test_running_the_reference_imports_no_native_compute_module() -> None:
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "DSV4_PARITY_CACHE")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "FORBIDDEN:", out.stdout


def test_reference_sources_import_only_allowed_dsv4_modules() -> None:
    for path in sorted((ROOT / "reference").rglob("*.py")):   # training/ too
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names if node.module == "dsv4"]
            for n in names:
                if n.startswith("dsv4."):
                    assert n.startswith(ALLOWED), (path.name, n)
