"""Runs, not only opens: a tiny checkpoint of every layout (written by synth from the layout's own
description) passes first-token parity in chat mode on the CPU, and the run names the layout."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from dsv4.checkpoint.layouts import FLAVORS
from dsv4.checkpoint.synth import synth
from parity import first_token


@pytest.mark.slow   # one synth + one first_token run per layout: ~6-9 s each on 2 cores
@pytest.mark.parametrize("flavor", FLAVORS)
def test_first_token_passes_on_every_layout(flavor, tmp_path) -> None:
    ckpt = synth("tiny", flavor, tmp_path / flavor)
    summary = tmp_path / "s.json"
    buf = io.StringIO()
    # compressed-tensors: judged by its own plan (FP8-block attention, BF16 shared experts), see
    # tests/dsv4/checkpoint/test_layouts.py::_PLAN_ARGS
    plan = ["--plan", "checkpoint"] if flavor == "compressed-tensors" else []
    rc = first_token.main(["--checkpoint", str(ckpt), "--mode", "chat", "--json", str(summary), *plan],
                          console=Console(file=buf, width=200))
    assert rc == 0, buf.getvalue()[-3000:]
    s = json.loads(summary.read_text())
    assert s["verdict"]["passed"]
    dry = io.StringIO()
    assert first_token.main(["--checkpoint", str(ckpt), "--dry-run"], console=Console(file=dry, width=200)) == 0
    assert f"layout {flavor} " in dry.getvalue()
