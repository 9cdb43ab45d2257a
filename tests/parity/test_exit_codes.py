"""One exit-code contract for every CLI, and a zoo whose rows never take each other down."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from parity.bugzoo import unregister_fault
from parity.bugzoo.__main__ import main as zoo_main
from parity.cli import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TOOL_FAILED, run_cli
from parity.errors import ParityInputError


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200), buf


def test_run_cli_maps_failures_to_codes_with_a_logged_traceback(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DSV4_PARITY_CACHE", str(tmp_path))
    con, buf = _console()

    def boom(_: Console) -> int:
        raise RuntimeError("something inside the tool broke")

    assert run_cli(boom, con) == EXIT_TOOL_FAILED
    out = buf.getvalue()
    assert "internal error (RuntimeError: something inside the tool broke)" in out and "Traceback" not in out
    logs = list((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text() and str(logs[0]) in out.replace("\n", "")

    def bad(_: Console) -> int:
        raise ParityInputError("--thing: expected X, found Y")

    def interrupted(_: Console) -> int:
        raise KeyboardInterrupt

    assert run_cli(bad, _console()[0]) == EXIT_BAD_INPUT
    assert run_cli(interrupted, _console()[0]) == EXIT_INTERRUPTED


@pytest.mark.parity
def test_a_crashing_fault_marks_its_row_and_keeps_the_others(tmp_path: Path) -> None:
    mod = tmp_path / "crashing_faults.py"
    mod.write_text('from parity.bugzoo import register_fault\n'
                   '@register_fault("test_crashes", layer=0, component="attention", column="logic",\n'
                   '                description="raises inside the patched model")\n'
                   'def crashes(model):\n'
                   '    def explode(*a, **k):\n'
                   '        raise RuntimeError("kaboom in layer 0")\n'
                   '    model.blocks[0].attention.attend = explode\n'
                   '    try:\n        yield\n    finally:\n        del model.blocks[0].attention.attend\n'
                   '@register_fault("test_sink_again", layer=0, component="attention", column="logic",\n'
                   '                description="the attention sink dropped (a real bug, must still be caught)")\n'
                   'def sink(model):\n'
                   '    from parity.bugzoo import get_fault\n'
                   '    with get_fault("attention_sink_dropped")(model):\n        yield\n')
    js = tmp_path / "zoo.json"
    try:
        con, buf = _console()
        # --faults-module alone runs only that module's faults (not the 23 built-ins)
        rc = zoo_main(["--faults-module", str(mod), "--no-clean", "--json", str(js)], console=con)
    finally:
        unregister_fault("test_crashes")
        unregister_fault("test_sink_again")
    assert rc == EXIT_TOOL_FAILED, buf.getvalue()
    rows = {r["fault"]: r for r in json.loads(js.read_text())["rows"]}
    assert set(rows) == {"test_crashes", "test_sink_again"}
    assert "RuntimeError: kaboom in layer 0" in rows["test_crashes"]["error"] and not rows["test_crashes"]["passed"]
    assert rows["test_sink_again"]["passed"] and rows["test_sink_again"]["error"] is None


@pytest.mark.parity
@pytest.mark.slow   # a zoo clean row (~10 s)
def test_clean_only_runs_the_clean_row(tmp_path: Path) -> None:
    js = tmp_path / "zoo.json"
    con, buf = _console()
    assert zoo_main(["--clean-only", "--json", str(js)], console=con) == 0, buf.getvalue()
    assert [r["fault"] for r in json.loads(js.read_text())["rows"]] == [None]
    assert zoo_main(["--clean-only", "--no-clean"], console=_console()[0]) == EXIT_BAD_INPUT
