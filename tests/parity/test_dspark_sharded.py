"""DSpark draft parity over torchrun ranks (parity/dspark/sharded.py) gives what one process gives:
the whole JSON summary (checks, acceptance, the merged kernel audit) equal for 2 and 3 ranks, gloo
on CPU, with the example kernel backend so that the bug-budget column and its audit run too. A rank
that does not start with the first prompt replays its draft calls first: without that, its frozen
activation scales differ from one process's and so do its results (the control below)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tiled_gemm_backend", reason="the example kernel backend (pip install -e examples/tiled_gemm_backend)")

PROMPTS = ["chat-capital", "chat-explain", "chat-mixed-unicode"]
ARGS = ["--mode", "chat", "--device", "cpu", "--backend", "tiled_gemm", "--columns", "floor,bug_budget",
        "--tokens", "6", *[a for p in PROMPTS for a in ("--prompt", p)]]


def _run(cmd: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    r = subprocess.run([*cmd, *ARGS, "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-3000:])
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    return _run([sys.executable, "-m", "parity.dspark"], tmp_path_factory.mktemp("one") / "one.json")


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_give_the_summary_of_one_process(tmp_path, one_process, n) -> None:
    got = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                "-m", "parity.dspark"], tmp_path / "ranks.json")
    assert got == one_process
    assert got["columns"]["bug_budget"]["audit"]["calls"] > 0 and got["verdict"]["passed"]


def test_a_rank_starting_elsewhere_replays_the_first_prompts_draft_calls() -> None:
    from dataclasses import replace

    from parity.dspark.__main__ import build_parser, _source
    from parity.dspark.run import DraftSpec, run_draft_parity
    from parity.inputs import encode_prompts, select_prompts

    args = build_parser().parse_args(ARGS)
    src = _source(args, "cpu")
    first, other = encode_prompts(select_prompts("chat", [PROMPTS[0], PROMPTS[2]], None), src.tokenizer,
                                  src.config.vocab_size)
    spec = DraftSpec(source=src, prompts=[first, other], backend="tiled_gemm", n_tokens=6,
                     columns=["floor", "bug_budget"])

    def seen(result) -> tuple:
        return tuple((name, pair, tuple(run.spec[pair][other.id].tokens), tuple(run.spec[pair][other.id].accepted))
                     for name, run in result.columns.items() for pair in run.spec) + \
            tuple((name, r["mode"], r["metric"], r["place"], r["value"]) for name, run in result.columns.items()
                  for r in run.rows if r["prompt"] == other.id)

    whole = seen(run_draft_parity(spec))
    assert seen(run_draft_parity(replace(spec, prompts=[other], freeze_prompt=first))) == whole
    assert seen(run_draft_parity(replace(spec, prompts=[other]))) != whole     # the control: scales of another first call
