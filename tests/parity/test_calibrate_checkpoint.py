"""``python -m parity.calibrate --checkpoint DIR``: thresholds for one (real) checkpoint, calibrated
on the hold-out prompts, held out per prompt, written only where asked; then used by first_token."""
from __future__ import annotations

import io
import tomllib
from pathlib import Path

import pytest
import torch
from rich.console import Console

from dsv4.checkpoint.synth import resolve_preset
from parity import calibrate, first_token
from parity.rules import default_rules_path


def _run(main, args: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    rc = main(args, console=Console(file=buf, width=200, force_terminal=False))
    return rc, buf.getvalue()


@pytest.fixture(scope="module")
def checkpoint_dir() -> Path:
    # a synthetic checkpoint passed as a directory stands in for a real one (seed 1: not the default run's)
    torch.set_num_threads(1)
    return resolve_preset("tiny", "nvidia-nvfp4", 1)


@pytest.mark.slow   # a calibration (~6 s)
def test_checkpoint_calibration_writes_rules_that_judge_the_standard_prompts(checkpoint_dir: Path,
                                                                             tmp_path: Path) -> None:
    out = tmp_path / "rules" / "mine.toml"
    before = default_rules_path().read_bytes()
    rc, text = _run(calibrate.main, ["--checkpoint", str(checkpoint_dir), "--modes", "chat", "--profiles", "bf16",
                                     "--out", str(out)])
    assert rc == 0, text
    assert default_rules_path().read_bytes() == before          # the shipped thresholds are untouched
    doc = tomllib.loads(out.read_text())
    cal = doc["calibration"]
    assert cal["checkpoint"] == str(checkpoint_dir) and cal["prompt_set"].endswith("prompts_holdout.toml")
    assert "seeds" not in cal and cal["leave_one_prompt_out"].endswith("when a prompt is held out")
    assert f"the checkpoint {checkpoint_dir}" in out.read_text().split("[settings]")[0]
    assert "leave-one-prompt-out:" in text
    budget = [r for r in doc["rule"] if r.get("pair") == "bug_budget"]   # the H200 defaults, not calibrated here
    assert {r["metric"] for r in budget} == {"cosine", "rel_diff", "kl_mean"}
    assert all(r["note"] == calibrate.BUG_BUDGET_NOTE for r in budget)
    # the rules judge the standard prompts (never seen in calibration) on the same checkpoint
    rc, text = _run(first_token.main, ["--checkpoint", str(checkpoint_dir), "--mode", "chat", "--rules", str(out)])
    assert rc == 0, text


@pytest.mark.parametrize("extra, message", [
    ([], "expected --out FILE"),
    (["--out", "DEFAULT"], "is not replaced from another checkpoint"),
    (["--out", "x.toml", "--seeds", "1,2"], "--preset/--seeds select synthetic ones"),
])
def test_checkpoint_calibration_bad_flags_exit_2_before_running(checkpoint_dir: Path, extra: list[str],
                                                                message: str) -> None:
    extra = [str(default_rules_path()) if a == "DEFAULT" else a for a in extra]
    rc, text = _run(calibrate.main, ["--checkpoint", str(checkpoint_dir)] + extra)
    assert rc == 2 and message in " ".join(text.split()), text


def test_a_missing_checkpoint_directory_exits_2(tmp_path: Path) -> None:
    rc, text = _run(calibrate.main, ["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "r.toml")])
    assert rc == 2 and "found nothing at" in " ".join(text.split())


def test_only_preset_calibration_measures_the_bug_budget_on_a_kernel(checkpoint_dir: Path, tmp_path: Path) -> None:
    import argparse

    con = Console(file=io.StringIO())
    real = calibrate.calibration_source(argparse.Namespace(checkpoint=str(checkpoint_dir), preset="tiny", seeds=None,
                                                           out=str(tmp_path / "r.toml"), prompt_set=None), con)
    preset = calibrate.calibration_source(argparse.Namespace(checkpoint=None, preset="tiny", seeds=None, out=None,
                                                             prompt_set=None), con)
    assert real.bug_budget is False and real.held_out_by == "prompt_id" and len(real.sources) == 1
    assert preset.bug_budget is True and preset.held_out_by == "seed"
    assert [s for _, s in preset.sources] == list(calibrate.DEFAULT_SEEDS)
