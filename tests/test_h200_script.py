"""The H200 validation script (benchmarks/run_h200_validation.sh) runs when a GPU session is lent, which
is rare: a CLI option renamed since then would cost that session's device time. Every `python3 -m`
step of a CLI with a `build_parser` is parsed here by that parser, as the script calls it."""
from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run_h200_validation.sh"


def module_steps() -> list[tuple[str, list[str]]]:
    """(module, argv) of every `python3 -m` step but pytest; a shell-variable word ($RES/x.json) becomes
    a placeholder path."""
    text = SCRIPT.read_text(encoding="utf-8").replace("\\\n", " ")   # join continued lines
    steps = []
    for m in re.finditer(r"python3 -m ([\w.]+)([^\n]*)", text):
        if m.group(1) != "pytest":
            words = shlex.split(m.group(2))
            steps.append((m.group(1), ["/tmp/placeholder" if w.startswith("$") else w for w in words]))
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
