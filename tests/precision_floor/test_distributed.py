"""Runs spread over torchrun ranks (gloo on CPU) give what one process gives: the flip tables and the
floor search (precision_floor.distributed), the first-token records of a prompt set
(parity.distributed); a killed rank loses no finished evaluation on resume. Each launch is a real
``python -m torch.distributed.run --standalone`` subprocess (~5-10 s each on a 2-core box)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parity.records import read_records
from precision_floor.cache import EvalStore

HERE = Path(__file__).parent
WORKER = HERE / "dist_worker.py"
sys.path.insert(0, str(HERE))
from dist_worker import CLASSES, PROMPT_IDS  # noqa: E402

TOTAL = 2 + 2 * len(CLASSES)      # two baselines + one plan per class and direction


def torchrun(n: int, *args: str, check: bool = True, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check:
        assert r.returncode == 0, (cmd, r.stdout[-3000:], r.stderr[-3000:])
    return r


def ranks(out: Path, n: int) -> list[dict]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(n)]


def scores(tables: dict) -> dict:
    """The tables without store digests (they hold the code version: another engineer's commit between
    two launches changes them, not the scores)."""
    strip = lambda row: {k: v for k, v in row.items() if k != "digest"}   # noqa: E731
    return {"baselines": {k: strip(v) for k, v in tables["baselines"].items()},
            **{d: [strip(r) for r in tables[d]] for d in ("rescue", "damage")}}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, tiny) -> dict:
    """The flip tables computed in one process (the worker without torchrun)."""
    d = tmp_path_factory.mktemp("one")
    r = subprocess.run([sys.executable, str(WORKER), str(d / "store"), str(d / "out")], capture_output=True,
                       text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    got = ranks(d / "out", 1)[0]
    assert (got["size"], got["computed"], got["loaded"]) == (1, TOTAL, 0)
    return got


@pytest.mark.parametrize("n", [2, 3])
def test_flips_over_ranks_equal_one_process_and_compute_each_plan_once(tmp_path, one_rank, n) -> None:
    torchrun(n, str(WORKER), str(tmp_path / "store"), str(tmp_path / "out"))
    got = ranks(tmp_path / "out", n)
    assert scores(got[0]["tables"]) == scores(one_rank["tables"])   # bit-identical scores, same order
    assert sum(g["computed"] for g in got) == TOTAL                   # every plan computed by exactly one rank
    assert all(g["computed"] + g["loaded"] == TOTAL for g in got)     # ... and read by the others
    assert all(g["computed"] >= 1 for g in got)                       # the work was spread
    assert len(EvalStore(tmp_path / "store").manifests()) == TOTAL


def test_killed_rank_resume_recomputes_only_unfinished_evaluations(tmp_path, one_rank) -> None:
    store, out = tmp_path / "store", tmp_path / "out"
    r = torchrun(2, str(WORKER), str(store), str(out), "--die-on-rank", "1", "--die-after", "1", check=False)
    assert r.returncode != 0                                          # the launch failed with its rank
    finished = len(EvalStore(store).manifests())
    assert 1 <= finished < TOTAL, finished                            # rank 1's first evaluation survived
    torchrun(2, str(WORKER), str(store), str(out), "--resume")
    got = ranks(out, 2)
    assert sum(g["computed"] for g in got) == TOTAL - finished        # nothing finished was recomputed
    assert scores(got[0]["tables"]) == scores(one_rank["tables"])
    assert len(EvalStore(store).manifests()) == TOTAL


def test_search_cli_under_torchrun_matches_one_process(tmp_path, tiny) -> None:
    common = ["--checkpoint", "tiny", "--classes", ",".join(CLASSES), "--budget-kl", "0.03", "--budget-top1", "0",
              "--device", "cpu", "--threads", "1"]
    for p in PROMPT_IDS[:2]:
        common += ["--prompt", p]
    one = subprocess.run([sys.executable, "-m", "precision_floor.search", *common, "--records", str(tmp_path / "a")],
                         capture_output=True, text=True, timeout=240)
    assert one.returncode in (0, 1), one.stderr[-3000:]
    two = torchrun(2, "-m", "precision_floor.search", *common, "--records", str(tmp_path / "b"), check=False)
    assert two.returncode == one.returncode, two.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "search.json").read_text()) for d in "ab")
    strip = lambda rows: [{k: v for k, v in r.items() if k != "digest"} for r in rows]   # noqa: E731
    assert b["floor_set"] == a["floor_set"] and strip(b["steps"]) == strip(a["steps"])
    assert strip(b["visited"]) == strip(a["visited"]) and len(a["visited"]) >= 3
    assert two.stdout.count("evaluation(s) computed") == one.stdout.count("evaluation(s) computed") == 1
    assert len(EvalStore(tmp_path / "b").manifests()) == len(EvalStore(tmp_path / "a").manifests())


@pytest.mark.parametrize("n", [2, 3])
def test_first_token_over_ranks_writes_the_records_of_one_process(tmp_path, tiny, n) -> None:
    """Four prompts over n ranks (3 ranks: shares of 2, 1, 1): same records in the same order, the
    run-level KL / top-1 aggregates recomputed over every prompt's positions."""
    args = ["--checkpoint", "tiny", "--mode", "chat", "--columns", "logic,floor", "--device", "cpu", "--threads", "1"]
    from dsv4.prompts import load_prompt_set

    for p in [q.id for q in load_prompt_set() if q.mode == "chat"][:4]:
        args += ["--prompt", p]
    one = subprocess.run([sys.executable, "-m", "parity.first_token", *args, "--records", str(tmp_path / "one.jsonl"),
                          "--reference-cache", str(tmp_path / "ref-one")],
                         capture_output=True, text=True, timeout=240)
    assert one.returncode in (0, 1), one.stderr[-3000:]
    many = torchrun(n, "-m", "parity.first_token", *args, "--records", str(tmp_path / "many.jsonl"),
                    "--reference-cache", str(tmp_path / "ref-many"), check=False)
    assert many.returncode == one.returncode, many.stderr[-3000:]
    a, b = (read_records(tmp_path / f).drop(columns=["run_id", "code_version"]) for f in ("one.jsonl", "many.jsonl"))
    assert len(a) == len(b) > 0 and b["prompt_id"].nunique() == 5     # 4 prompts + the run-level '*'
    assert a.equals(b)
    assert read_records(tmp_path / "many.jsonl")["run_id"].nunique() == 1
    assert many.stdout.count("wall ") == one.stdout.count("wall ") == 1   # the report printed once
