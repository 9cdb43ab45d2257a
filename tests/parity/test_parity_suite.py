"""The parity suite (``pytest -m parity``): the real reference and native models on the trained tiny
checkpoint (or ``--checkpoint``) on whatever device is present; the backend is auto-selected and
recorded. ``DSV4_PARITY_RULES`` selects another thresholds file (a real checkpoint needs its own:
the shipped ones are calibrated on the built-in tiny models)."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from dsv4 import probes
from dsv4.plan import PrecisionPlan
from parity import check, compare_dumps, dumps, first_token
from parity.inputs import encode_prompts, select_prompts
from parity.records import to_frame
from parity.rules import load_rules
from parity.runner import DefaultLoaders
from parity.source import resolve_checkpoint
from parity.threeway import RunSpec, run_threeway, settings_from_rules
from parity.verdict import evaluate

pytestmark = pytest.mark.parity
RULES = os.environ.get("DSV4_PARITY_RULES")


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=220), buf


@pytest.mark.parametrize("mode", ["chat", "thinking"])
def test_default_run_on_the_trained_model_passes(mode: str, tmp_path: Path) -> None:
    recs, summary = tmp_path / "r.jsonl", tmp_path / "s.json"
    con, buf = _console()
    rc = first_token.main(["--mode", mode, "--records", str(recs), "--json", str(summary)], console=con)
    out = buf.getvalue()
    assert rc == 0, out
    s = json.loads(summary.read_text())
    assert s["verdict"]["passed"] and s["verdict"]["floor_is_floor"]
    assert s["columns"]["logic"]["ran"] and s["columns"]["floor"]["ran"]
    assert s["verdict"]["pairs"]["floor"]["first_divergence"] is None
    # re-judging the stored records gives the same verdict without running anything
    con, buf = _console()
    assert check.main([str(recs)], console=con) == 0, buf.getvalue()


def test_suite_on_the_checkpoint_and_device(checkpoint_arg: str, device: str) -> None:
    src = resolve_checkpoint(checkpoint_arg)
    if device == "cpu" and src.config.hidden_size <= 1024:
        torch.set_num_threads(1)
    rules = load_rules(RULES, checkpoint_arg)
    prompts = encode_prompts(select_prompts("chat")[:3], src.tokenizer, src.config.vocab_size)
    spec = RunSpec(source=src, prompts=prompts, plan=PrecisionPlan.preset("default"), device=device,
                   settings=settings_from_rules(rules))
    res = run_threeway(spec, DefaultLoaders())
    df = to_frame(res.records)
    verdict = evaluate(df, rules, [m for c in res.columns.values() for m in c.kernels_missing])
    assert verdict.passed, verdict.summary()["failed_rules"][:5]
    assert set(df[df["pair"] == "floor"]["backend"]) == {"emulated"}
    bug = res.columns["bug_budget"]
    if bug.ran:   # a kernel backend executes here: it is what the records name
        assert set(df[df["pair"] == "bug_budget"]["backend"]) == {bug.test.split("/")[-1]}
    else:
        assert bug.reason.startswith(f"no kernel backend executes on {torch.device(device).type}")


class _LayerFault:
    """A real native model whose layer ``layer`` output streams are scaled: a deliberate logic bug."""

    def __init__(self, inner: Any, layer: int, scale: float) -> None:
        self.inner, self.fault_layer, self.scale = inner, layer, scale
        self.config, self.fingerprint = inner.config, inner.fingerprint

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def layer(self, i: int, X: torch.Tensor, state: Any) -> torch.Tensor:
        out = self.inner.layer(i, X, state)
        if i == self.fault_layer:
            out = out * self.scale
            probes.emit(f"layers.{i}.out", out)   # the recorder keeps the last value per name
        return out

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        state = self.inner.new_state(ids)
        X = self.inner.embed(ids)
        for i in range(self.config.num_hidden_layers):
            X = self.layer(i, X, state)
        return self.inner.head(X)


class _FaultyLoaders(DefaultLoaders):
    def native(self, path: str, **kw: Any) -> Any:
        return _LayerFault(super().native(path, **kw), layer=2, scale=1.02)


def test_default_thresholds_catch_and_localize_a_two_percent_layer_fault(tmp_path: Path) -> None:
    summary = tmp_path / "s.json"
    con, buf = _console()
    rc = first_token.main(["--mode", "chat", "--prompt", "chat-capital", "--prompt", "chat-explain", "--json",
                           str(summary)], loaders=_FaultyLoaders(), console=con)
    assert rc == 1, buf.getvalue()
    s = json.loads(summary.read_text())
    d = s["verdict"]["pairs"]["logic"]["first_divergence"]
    assert (d["probe"], d["layer"], d["component"]) == ("layers.2.out", 2, "mhc")
    assert not s["verdict"]["floor_is_floor"]


def test_native_dump_compares_like_the_floor_column(tmp_path: Path) -> None:
    con, buf = _console()
    assert dumps.main(["--from-native", "--prompt", "chat-capital", "--out", str(tmp_path / "d")], console=con) == 0
    con, buf = _console()
    rc = compare_dumps.main(["--dumps", str(tmp_path / "d"), "--reference-cache", str(tmp_path / "cache")],
                            console=con)
    assert rc == 0, buf.getvalue()
    assert "engine dsv4-native:default/emulated" in buf.getvalue()
