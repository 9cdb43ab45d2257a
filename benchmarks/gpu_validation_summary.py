"""One JSON summary of a GPU validation run (benchmarks/run_gpu_validation.sh), naming the card.

    python benchmarks/gpu_validation_summary.py RESULTS_DIR --out FILE

Reads what the steps left in RESULTS_DIR (steps.jsonl: name, exit code, seconds; each step's own JSON;
pytest's junit XML) and writes, per step, its exit code, time and the figures that carry its verdict.
A step whose JSON is missing or unreadable is reported as such, never skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _card() -> dict[str, Any]:
    try:
        import torch

        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            return {"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}", "torch": torch.__version__, "cuda": torch.version.cuda}
        return {"name": "no CUDA device", "torch": torch.__version__}
    except Exception as e:  # the summary is still written
        return {"name": f"unknown ({e})"}


def _pytest(res: Path, name: str) -> dict[str, Any] | None:
    try:
        root = ET.parse(res / f"{name}.xml").getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    skipped = sorted({(s.get("message") or "")[:160] for s in suite.iter("skipped")})
    return {**n, "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "failed": failed,
            "skip_reasons": skipped}


def _audit_of(columns: Any) -> Any:
    for c in columns if isinstance(columns, list) else []:
        if isinstance(c, dict) and c.get("name") == "bug_budget":
            return {k: c.get(k) for k in ("audit", "weight_audit", "backend") if k in c}
    return None


ROW_FIGURES = {"zoo": ("fault", "backend", "caught", "localized", "passed", "error", "seconds"),
               "decode": ("config", "device", "ms_per_step", "wall_over_kernel", "wall_over_kernel_target",
                          "graph_equals_eager", "eager_launches_per_step", "host_per_eager_launch_us")}


def _figures(name: str, data: dict[str, Any] | None) -> dict[str, Any]:
    """The figures that carry a step's verdict (the whole JSON stays in the results directory)."""
    if data is None:
        return {"json": "missing"}
    keep = ("verdict", "passed", "audit", "calls", "violating_calls", "violations", "worst_ratio", "failure",
            "errors", "backend", "device", "timing", "rows", "summary", "seconds", "audited_over_plain",
            "audit_overhead_over_emulated", "weights_exact", "columns", "acceptance", "tau")
    out = {k: data[k] for k in keep if k in data}
    if "rows" in out:   # one line per row: the bug zoo's faults, or the decode bench's configs
        keys = ROW_FIGURES["decode" if any("config" in r for r in out["rows"]) else "zoo"]
        out["rows"] = [{k: r.get(k) for k in keys} for r in out["rows"]]
    if isinstance(out.get("verdict"), dict):
        v = out["verdict"]
        out["verdict"] = {k: v[k] for k in ("passed", "failed_rules", "first_divergence", "pairs") if k in v} or v
    if "columns" in out:
        a = _audit_of(out.pop("columns"))
        if a is not None:
            out["bug_budget"] = a
    return out


def summarize(res: Path) -> dict[str, Any]:
    steps = []
    for line in (res / "steps.jsonl").read_text().splitlines() if (res / "steps.jsonl").exists() else []:
        try:
            s = json.loads(line)
        except ValueError:
            continue
        s["timed_out"] = s["rc"] in (124, 137)
        if s["name"].startswith("pytest_"):
            s["pytest"] = _pytest(res, s["name"])
        else:
            stem = {"decode300_audited": "decode300", "decode_graphs": "decode64_graphs"}.get(s["name"], s["name"])
            s["result"] = _figures(s["name"], _load(res / f"{stem}.json"))   # beside the step's own fields
        steps.append(s)
    latest = {s["name"]: s for s in steps}       # a part rerun replaces its steps' earlier results
    return {"schema": "dsv4-parity.gpu-validation/1", "card": _card(), "steps": list(latest.values()),
            "all_passed": bool(latest) and all(s["rc"] == 0 for s in latest.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="the results directory of run_gpu_validation.sh")
    ap.add_argument("--out", required=True, help="the summary JSON to write")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from parity.records import atomic_write_json

    s = summarize(Path(a.results))
    atomic_write_json(a.out, s)
    for st in s["steps"]:
        print(f"{st['name']:<22} rc {st['rc']:>3}  {st['seconds']:>4} s")
    print(f"card: {s['card'].get('name')}; all passed: {s['all_passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
