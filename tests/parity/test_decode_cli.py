"""``python -m parity.decode``: exit codes, input checks, the free-running divergence and degeneration
verdicts (from records alone), forced sequences, probe steps. Short runs of the real tiny models."""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from rich.console import Console

from parity import decode
from parity.records import read_records
from parity.runner import DefaultLoaders

CAPITAL = ["--prompt", "chat-capital"]        # 67 tokens


def _on_tiny(args: list[str]) -> list[str]:
    """These harness tests run on the synthetic tiny checkpoint (the fixtures' source), not the default."""
    return args if "--checkpoint" in args else ["--checkpoint", "tiny", *args]


def _run(args: list[str], loaders: Any = None) -> tuple[int, str]:
    buf = io.StringIO()
    rc = decode.main(_on_tiny(args), loaders=loaders, console=Console(file=buf, width=220))
    return rc, buf.getvalue()


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.mark.parametrize("args, message", [
    (["--free", "--forced", "sample"], "applies to --teacher-forced only"),
    (["--tokens", "960"], "at most 958 steps"),
    (["--tokens", "20", "--probe-steps", "0,5"], "probe steps: expected decode steps in [1, 19]"),
    (["--tokens", "20", "--probe-steps", "a,b"], "--probe-steps: expected"),
    (["--forced", "1,2,x"], "--forced: expected greedy, sample, integer ids or @FILE"),
    (["--forced", "@/nonexistent/ids.txt"], "cannot read the file"),
    (["--forced", "3,4,999", "--tokens", "3"], "ids in [0, 512)"),
    (["--forced", "3,4", "--tokens", "3"], "at least 3"),
    (["--mutual-topk", "0"], "expected >= 1"),
    (["--graphs", "--device", "cpu"], "--graphs: CUDA-graph decoding needs --device cuda"),
])
def test_bad_input_exits_2_with_the_reason(args: list[str], message: str) -> None:
    rc, out = _run(CAPITAL + args)
    assert rc == 2, out
    assert message in out.replace("\n", " "), out


def test_forced_ids_are_fed_to_both_models_and_recorded(tmp_path: Path) -> None:
    ids = [65, 66, 67, 68, 69, 70, 71, 72]
    (tmp_path / "ids.txt").write_text(json.dumps(ids))
    recs, js = tmp_path / "r.jsonl", tmp_path / "s.json"
    rc, out = _run(CAPITAL + ["--forced", f"@{tmp_path / 'ids.txt'}", "--probe-steps", "3", "--records", str(recs),
                              "--json", str(js)])
    assert rc == 0, out
    s = json.loads(js.read_text())
    p = s["prompts"][0]
    assert s["tokens"] == 8 and p["continuation"]["reference"] == ids and p["continuation"]["native"] == ids
    df = read_records(recs)
    kl = df[df["metric"] == "step_kl"].sort_values("step")
    assert kl["step"].tolist() == list(range(8)) and kl["position"].tolist() == list(range(66, 74))
    probe = df[(df["step"] == 3) & (df["probe"] == "layers.2.out")]
    assert set(probe["metric"]) >= {"step_cosine", "step_rel_diff"}          # per-layer cosine at the probe step
    assert (df[df["metric"] == "hash_route_exact"]["value"] == 1.0).all()   # exact metrics keep their names
    agg = df[df["prompt_id"] == "*"]
    assert set(agg["metric"]) >= {"kl_mean", "top1_agree_tieaware_rate", "forced_dp_rms"}
    assert "dp_rms" not in set(agg["metric"])     # target-dependent: renamed, left to decode-specific rules


def test_auto_probe_steps_include_the_first_hca_block_close() -> None:
    from dsv4.config import preset

    c = preset("tiny")
    # 67-token prompt: step s writes position 66 + s; the HCA (16) block closes when 67 + s is a multiple of 16
    assert decode.auto_probe_steps(c, 67, 300) == [1, 13, 150, 299]
    assert decode.auto_probe_steps(c, 64, 5) == [1, 2, 4]          # 64 % 16 == 0: the next close is 16 away


class _Diverging:
    """The native model, except that from step ``at`` on it strongly prefers ``token``."""

    def __init__(self, model: Any, at: int, token: int, margin: float) -> None:
        self._m, self.at, self.token, self.margin = model, at, token, margin
        self._start = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)

    def prefill(self, ids: torch.Tensor) -> Any:
        self._start = int(ids.numel())
        return self._m.prefill(ids)

    def decode_step(self, state: Any, tok: int) -> torch.Tensor:
        out = self._m.decode_step(state, tok)
        if state.pos - self._start >= self.at:
            out = out.clone()
            out[self.token] = out.max() + self.margin
        return out


class _Loaders(DefaultLoaders):
    def __init__(self, **kw: Any) -> None:
        self.kw = kw

    def native(self, *a: Any, **k: Any) -> Any:
        return _Diverging(super().native(*a, **k), **self.kw)


def test_free_running_clear_flip_fails_with_the_step_and_ranks(tmp_path: Path) -> None:
    recs = tmp_path / "r.jsonl"
    rc, out = _run(CAPITAL + ["--free", "--tokens", "30", "--probe-steps", "none", "--records", str(recs)],
                   _Loaders(at=7, token=100, margin=20.0))
    assert rc == 1, out
    assert "clear flip at step 7" in out.replace("\n", " ")
    df = read_records(recs)
    v = dict(zip(df["metric"], df["value"]))
    assert v["divergence_step"] == 7 and v["divergence_mutual_topk"] == 0.0 and v["divergence_near_tie"] == 0.0
    assert v["divergence_native_token_ref_rank"] > 5
    assert (df[df["metric"] == "step_kl"]["step"].max()) == 7   # steps past the divergence are not compared
    assert decode.free_running_failures(df) and decode.free_running_failures(df)[0].startswith("prompt chat-capital")


def _rows(**vals: float) -> pd.DataFrame:
    return pd.DataFrame([{"prompt_id": "p", "probe": "logits", "metric": k, "value": v} for k, v in vals.items()])


def test_free_running_verdict_from_records() -> None:
    base = dict(divergence_found=1.0, divergence_step=4, divergence_ref_top2_margin=0.02, divergence_near_tie=1.0,
                divergence_native_token_ref_rank=2, divergence_ref_token_native_rank=2, divergence_mutual_topk=1.0,
                divergence_mutual_topk_k=5, native_loop_found=0.0, reference_loop_found=0.0)
    assert decode.free_running_failures(_rows(**base)) == []                 # a near tie is forgiven
    clear = {**base, "divergence_near_tie": 0.0, "divergence_mutual_topk": 0.0}
    assert "clear flip at step 4" in decode.free_running_failures(_rows(**clear))[0]
    mutual = {**base, "divergence_near_tie": 0.0}
    assert decode.free_running_failures(_rows(**mutual)) == []               # mutual top-k is forgiven
    loops = {**base, "native_loop_found": 1.0, "native_loop_period": 2, "native_loop_start": 9}
    assert decode.free_running_failures(_rows(**loops)) == [
        "prompt p: native degenerates (period-2 loop from step 9), the reference does not"]
    both = {**loops, "reference_loop_found": 1.0}
    assert decode.free_running_failures(_rows(**both)) == []                 # the reference loops too


def test_logit_ranges_ignore_masked_entries() -> None:
    x = torch.tensor([[1.0, -2.0, float("-inf")], [0.5, 0.5, 3.0]])
    assert decode.logit_ranges(x).tolist() == [3.0, 2.5]


@pytest.mark.parametrize("bug, rc_want", [("", 0), ("ktail", 1)])
def test_a_kernel_backends_decode_calls_are_audited(tmp_path: Path, monkeypatch, bug: str, rc_want: int) -> None:
    """On a kernel backend (the example package here; cutedsl_sm90 on an H100) every native decode call
    is replayed through the oracle: a clean kernel has 0 violations, a faulty one fails the verdict."""
    pytest.importorskip("tiled_gemm_backend")
    from tiled_gemm_backend import BUG_ENV

    monkeypatch.setenv(BUG_ENV, bug)
    js = tmp_path / "s.json"
    rc, out = _run(CAPITAL + ["--tokens", "4", "--backend", "tiled_gemm", "--json", str(js)])
    assert rc == rc_want, out
    audit = json.loads(js.read_text())["audit"]
    assert audit["calls"] > 0 and "kernel audit on tiled_gemm" in out
    assert (audit["violating_calls"] == 0) == (bug == ""), audit
