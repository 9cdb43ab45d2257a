"""DSpark draft parity over torchrun ranks (parity/dspark/sharded.py) gives what one process gives:
the whole JSON summary (checks, acceptance, the merged kernel audit) equal for 2 and 4 ranks (units
of one column and one prompt, round robin: shares that mix columns, ranks with a single unit), gloo
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


@pytest.mark.parametrize("n", [2, 4])   # 6 (column, prompt) units: mixed shares; single-unit ranks
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


def test_merge_keeps_prompt_order_and_the_first_violation_one_process_meets() -> None:
    """Pure merge logic: units arrive in rank order, which is neither prompt nor part order; the merged
    column lists prompts and pairs in order and reports the violation one process meets first (the
    earliest prompt's, and there the draft-call half's before the crossed pairs')."""
    from types import SimpleNamespace

    from parity.dspark.run import PAIRS, ColumnRun
    from parity.dspark.sharded import SPLIT, merge

    prompts = [SimpleNamespace(id=f"p{i}") for i in range(3)]
    spec = SimpleNamespace(prompts=prompts, columns=["logic", "bug_budget"])
    half_a, half_b = SPLIT["bug_budget"]

    def col(name: str, ids: list[str], first: str | None = None, parts=None) -> ColumnRun:
        kw = {"parts": parts} if parts else {}
        c = ColumnRun(name, "a", "t", True, rows=[{"prompt": i, "value": n} for n, i in enumerate(ids)], **kw)
        pairs = [q for q in PAIRS if q in (parts or PAIRS)]
        c.spec = {q: {i: [n] for n, i in enumerate(ids)} for q in reversed(pairs)}   # out of order on purpose
        if name == "bug_budget":
            c.audit = {"calls": 10 * len(ids), "violations": int(first is not None), "violating_calls": int(first is not None),
                       "worst_ratio": 2.0 if first else 0.5, "errors": [],
                       "first": {"prompt_id": first, "module": f"{parts[0]}-{first}"} if first else None}
        return c

    runs = [col("bug_budget", ["p2"], "p2", half_a), col("bug_budget", ["p1"], "p1", half_b),
            col("logic", ["p1", "p0"]), col("bug_budget", ["p1"], "p1", half_a), col("logic", ["p2"]),
            col("bug_budget", ["p0"], None, half_a), col("bug_budget", ["p0", "p2"], None, half_b)]
    got = merge(spec, runs)
    assert list(got.columns) == ["logic", "bug_budget"]
    assert [r["prompt"] for r in got.columns["logic"].rows] == ["p0", "p1", "p2"]
    bb = got.columns["bug_budget"]
    assert list(bb.spec) == list(PAIRS) and all(list(v) == ["p0", "p1", "p2"] for v in bb.spec.values())
    assert bb.audit["calls"] == 60 and bb.audit["violations"] == 3
    assert bb.audit["first"] == {"prompt_id": "p1", "module": "draft_calls-p1"}


def test_units_split_the_bug_budget_in_two_and_put_it_first() -> None:
    from types import SimpleNamespace

    from parity.dspark.run import PARTS
    from parity.dspark.sharded import units

    spec = SimpleNamespace(columns=["logic", "floor", "bug_budget"], prompts=["p0", "p1"], parts=PARTS)
    got = [(c, part[0], p) for c, part, p in units(spec)]
    assert got == [("bug_budget", "draft_calls", "p0"), ("bug_budget", "draft_calls", "p1"),
                   ("bug_budget", "anchor+test", "p0"), ("bug_budget", "anchor+test", "p1"),
                   ("floor", "draft_calls", "p0"), ("floor", "draft_calls", "p1"),
                   ("logic", "draft_calls", "p0"), ("logic", "draft_calls", "p1")]
    assert sorted(q for c, part, p in units(spec) if c == "bug_budget" and p == "p0" for q in part) == sorted(PARTS)
