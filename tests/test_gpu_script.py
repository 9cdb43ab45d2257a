"""The GPU validation script (benchmarks/run_gpu_validation.sh) runs when a GPU session is lent, which
is rare: a CLI option renamed since then would cost that session's device time. Every `python3 -m`
step of a CLI with a `build_parser` is parsed here by that parser, as the script calls it, and the
summary writer is run on a results directory like the one the script leaves."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "run_gpu_validation.sh"


def module_steps() -> list[tuple[str, list[str]]]:
    """(module, argv) of every `python3 -m` step but pytest; a shell-variable word ($RES/x.json) becomes
    a placeholder path."""
    text = SCRIPT.read_text(encoding="utf-8").replace("\\\n", " ")   # join continued lines
    steps = []
    for m in re.finditer(r"python3 -m ([\w.]+)([^\n;]*)", text):   # a step ends at its line or a ;;
        if m.group(1) != "pytest":
            module, words = m.group(1), shlex.split(m.group(2))
            if module == "torch.distributed.run":       # torchrun's own options, then `-m MODULE args`
                i = words.index("-m")
                module, words = words[i + 1], words[i + 2:]
            steps.append((module, ["/tmp/placeholder" if w.startswith("$") else w for w in words]))
    return steps


def test_the_script_runs_draft_parity_on_the_sm90_kernels_in_both_modes() -> None:
    draft = [args for mod, args in module_steps() if mod == "parity.dspark"]
    assert draft and all(a[a.index("--backend") + 1] == "cutedsl_sm90" for a in draft), draft
    assert {a[a.index("--mode") + 1] for a in draft} == {"chat", "thinking"}


@pytest.mark.parametrize("module,args", module_steps(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_module_step_parses(module: str, args: list[str]) -> None:
    mod = importlib.import_module(module)
    if hasattr(mod, "__path__"):   # a package: `python -m` runs its __main__, as here
        mod = importlib.import_module(f"{module}.__main__")
    if not hasattr(mod, "build_parser"):
        pytest.skip(f"{module} has no build_parser to parse its arguments with")
    mod.build_parser().parse_args(args)   # a renamed or removed option exits 2 here


def test_the_script_covers_every_claim_of_the_gpu_validation() -> None:
    text = SCRIPT.read_text(encoding="utf-8")
    for needed in ('-m "(gpu or sm90) and not parity"', '-m "parity"', "parity.first_token --mode chat", "parity.first_token --mode thinking",
                   "parity.audit run", "--tokens 300", "--graphs", "kernel_alpha_of_next_expert", "bench_audit.py"):
        assert needed in text, needed


def test_the_summary_names_the_card_and_each_steps_verdict(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    res = tmp_path / "res"
    res.mkdir()
    (res / "steps.jsonl").write_text(
        '{"name": "audit_run", "rc": 0, "seconds": 12, "limit": 90}\n'
        '{"name": "dspark_chat", "rc": 124, "seconds": 180, "limit": 180}\n'
        '{"name": "audit_run", "rc": 1, "seconds": 13, "limit": 90}\n'       # a rerun replaces the first
        '{"name": "pytest_parity", "rc": 1, "seconds": 300, "limit": 540}\n')
    (res / "pytest_parity.xml").write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
        '<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="x"/></testcase>'
        '<testcase classname="t" name="c"><skipped message="needs an sm_100 GPU"/></testcase>'
        '<testcase classname="t" name="d"/></testsuite></testsuites>')
    (res / "audit_run.json").write_text(json.dumps({"calls": 760, "violating_calls": 2, "worst_ratio": "inf",
                                                    "seconds": {"plain": 0.5}}))   # a step's own 'seconds' kept apart
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_validation_summary.py"), str(res),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    steps = {st["name"]: st for st in s["steps"]}
    assert s["card"]["name"] and not s["all_passed"] and steps["audit_run"]["seconds"] == 13
    assert steps["audit_run"]["rc"] == 1 and steps["audit_run"]["result"]["violating_calls"] == 2
    assert steps["dspark_chat"]["timed_out"] and steps["dspark_chat"]["result"]["json"] == "missing"
    assert steps["pytest_parity"]["pytest"] == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2,
                                                "failed": ["t::b"], "skip_reasons": ["needs an sm_100 GPU"]}


def test_the_script_is_valid_bash_and_its_gate_runs_tests_beside_the_verdicts() -> None:
    import subprocess

    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, timeout=30).returncode == 0
    text = SCRIPT.read_text(encoding="utf-8")
    gate = text[text.index("  gate)"):text.index(";;", text.index("  gate)"))]
    assert "run_part tests &" in gate and "run_part verdicts" in gate and "run_part zoo" in gate and "wait" in gate
    assert "gate," in text[text.index("unknown part"):]


def test_the_summary_keeps_the_decode_benchs_figures_and_the_zoos_own(tmp_path: Path) -> None:
    """The decode bench and the bug zoo both write ``rows``: each keeps the figures that carry its verdict
    (a decode row once came out as a zoo row of nulls)."""
    import json
    import subprocess
    import sys

    res = tmp_path / "res"
    res.mkdir()
    (res / "steps.jsonl").write_text('{"name": "bench_decode_graphs", "rc": 0, "seconds": 67, "limit": 300}\n'
                                     '{"name": "zoo_kernel_faults", "rc": 0, "seconds": 50, "limit": 300}\n')
    (res / "bench_decode_graphs.json").write_text(json.dumps({"rows": [
        {"config": "tiny", "ms_per_step": {"graph": 5.1}, "wall_over_kernel": {"graph": 1.25},
         "graph_equals_eager": True, "device_work": {"eager": {}}}]}))
    (res / "zoo_kernel_faults.json").write_text(json.dumps({"rows": [{"fault": "f", "caught": True, "extra": 1}]}))
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_validation_summary.py"), str(res),
                        "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    steps = {st["name"]: st for st in json.loads(out.read_text())["steps"]}
    row = steps["bench_decode_graphs"]["result"]["rows"][0]
    assert row["config"] == "tiny" and row["wall_over_kernel"] == {"graph": 1.25} and row["graph_equals_eager"]
    assert "device_work" not in row and "fault" not in row
    assert steps["zoo_kernel_faults"]["result"]["rows"] == [{"fault": "f", "backend": None, "caught": True,
                                                             "localized": None, "passed": None, "error": None,
                                                             "seconds": None}]
