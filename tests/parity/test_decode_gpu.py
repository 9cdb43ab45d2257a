"""Decode parity through the CUDA-graph decoder on an H200 (``gpu`` + ``sm90``): ``--graphs`` must change
nothing but the speed — the per-step statistics of a teacher-forced run equal the eager run's exactly,
because the replayed logits are bit-identical. The summary goes to ``$OUT`` when set."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from parity import decode
from parity.records import read_records

pytestmark = [pytest.mark.gpu, pytest.mark.sm90, pytest.mark.parity]


def _shared_sm90() -> str:
    """One backend instance per device for every model of this process (kernels compile once)."""
    from dsv4.kernels.registry import register_shared_backend

    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    return register_shared_backend("cutedsl_sm90")


def test_teacher_forced_parity_through_graphs_equals_eager(tmp_path: Path) -> None:
    args = ["--device", "cuda:0", "--backend", _shared_sm90(), "--tokens", "64", "--prompt", "chat-capital",
            "--probe-steps", "1,13"]
    runs = {}
    for label, extra in (("eager", []), ("graphs", ["--graphs"])):
        recs, js = tmp_path / f"{label}.jsonl", tmp_path / f"{label}.json"
        buf = io.StringIO()
        rc = decode.main(args + extra + ["--records", str(recs), "--json", str(js)],
                         console=Console(file=buf, width=220))
        assert rc == 0, buf.getvalue()
        runs[label] = (read_records(recs), json.loads(js.read_text()))
    out = os.environ.get("OUT")
    if out:
        Path(out, "decode_parity_graphs.json").write_text(json.dumps(runs["graphs"][1], indent=1))
    summary = runs["graphs"][1]
    assert summary["native_decode"] == "cuda_graphs" and summary["backend"] == "cutedsl_sm90"
    segs = summary["graph_segments"]
    assert segs and all(s["mode"] == "graph" for s in segs if s["reason"] != "eager by design")
    kl = {k: df[df["metric"] == "step_kl"].sort_values("step")["value"].tolist() for k, (df, _) in runs.items()}
    assert len(kl["eager"]) == 64 and kl["graphs"] == kl["eager"]
    mem = runs["graphs"][1]["prompts"][0]["memory"]
    assert mem["kind"] == "cuda_allocated"
