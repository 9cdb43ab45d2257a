"""The real-width bench's code path at tiny width on the CPU (the lead runs it at Flash/Pro width on
a GPU), its torch encoders byte-identical to the synth encoders, its --help without torch, and the
time-to-verdict table built from its JSON."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_help_imports_no_torch() -> None:
    probe = ("import runpy, sys; sys.argv=['b', '--help']\ntry:\n runpy.run_path(%r, run_name='__main__')\n"
             "except SystemExit: pass\nprint('TORCH', 'torch' in sys.modules)") % str(BENCH / "bench_real_width.py")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "usage:" in r.stdout and "TORCH False" in r.stdout, r.stderr[-2000:]


def test_torch_encoders_are_byte_identical_to_synth() -> None:
    import real_width_synth as R
    from dsv4.checkpoint import synth as S

    g = np.random.default_rng(1)
    w = (g.standard_normal((256, 384)) * 0.05).astype(np.float32)
    w[0, :16] = [0.25, -0.75, 5.0, 7.0, 0, 1.25, -1.75, 2.5, 3.5, 5, -0.25, 0.2, 0.3, 0.4, 0.5, 0.6]  # ties, saturation
    w[1, :32] = 0.0                                                                            # an all-zero block
    pairs = [(S.encode_fp8_block(w), R.encode_fp8_block(torch.from_numpy(w))),
             (S.encode_mxfp4(w), R.encode_mxfp4(torch.from_numpy(w))),
             (S.encode_nvfp4(w, 0.0011), R.encode_nvfp4(torch.from_numpy(w), 0.0011))]
    for want, got in pairs:
        assert want.keys() == got.keys()
        for k in want:
            a, b = want[k], got[k]
            assert a.dtype == b.dtype and a.shape == b.shape, k
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b), k


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("rw")
    out = d / "rw.json"
    r = subprocess.run([sys.executable, str(BENCH / "bench_real_width.py"), "--width", "tiny", "--layers", "4",
                        "--prefill", "32,64", "--decode-cache", "64", "--decode-steps", "2", "--device", "cpu",
                        "--workdir", str(d / "work"), "--out", str(out)],
                       capture_output=True, text=True, timeout=120, env={"OMP_NUM_THREADS": "1", **__import__("os").environ})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "harness@64 done" in r.stdout                          # progress printed as it goes
    assert not (d / "work" / "flash-tiny-bench-official").exists()   # checkpoints deleted without --keep
    return json.loads(out.read_text())


def test_tiny_bench_measures_every_layer_kind_side_and_target(tiny_run) -> None:
    d = tiny_run
    assert d["config"]["layer_kinds"] == ["window/hash", "csa/hash", "hca/score", "csa/score"]
    got = {(r["side"], r["backend"], r.get("tokens")) for r in d["runs"] if r["phase"] == "prefill"}
    assert got == {(s, b, t) for s, b in (("reference", "reference(streaming)"), ("native", "emulated")) for t in (32, 64)}
    for r in (r for r in d["runs"] if r["phase"] == "prefill"):
        assert [x["kind"] for x in r["layers"]] == d["config"]["layer_kinds"]
        assert all(x["seconds"] > 0 and x["host_peak_rss_bytes"] > 0 for x in r["layers"])
    assert {x["backend"] for x in d["decode"]} == {"reference", "emulated"}
    assert all(x["cache_tokens"] == 64 and len(x["step_seconds"]) == 2 for x in d["decode"])
    assert [s["stage"] for s in d["skipped"]] == ["native:cutedsl_sm90"] and "cpu" in d["skipped"][0]["reason"]
    h = d["harness"]
    assert [x["tokens"] for x in h] == [32, 64] and all(x["column_errors"] == {} for x in h)
    assert all(x["plain_forward_seconds"] > 0 and -0.9 < x["overhead_ratio"] < 20 for x in h)
    # the reference term of the plain forwards is timed on the layout the harness reads (NVFP4), not on the
    # official layout's run; the rest (the native forwards) is the same in both sums
    for x in h:
        assert x["plain_reference_seconds"] > 0
        official = [r["total_seconds"] for r in d["runs"] if r["side"] == "reference" and r["phase"] == "prefill"
                    and r["tokens"] == x["tokens"]][0]
        assert x["plain_forward_seconds"] - x["plain_reference_seconds"] == pytest.approx(
            x["plain_forward_seconds_official_reference"] - official)
    # where the harness's time went: the phases add up to its wall time
    assert all(abs(sum(x["phases"].values()) - x["wall_seconds"]) < 1e-6 and x["phases"]["compare"] > 0 for x in h)
    # every native prefill length warmed up first (kernels compile per shape), every decode a step 0 apart
    warm = {(r["backend"], r["tokens"]) for r in d["runs"] if r["phase"] == "warmup"}
    assert {("emulated", 32), ("emulated", 64)} <= warm and all(x["warmup_step_seconds"] > 0 for x in d["decode"])
    t = d["targets"]
    assert t["harness_overhead"]["measured"] == [x["overhead_ratio"] for x in h]
    # a further prompt's overhead leaves out the per-checkpoint costs (loads, the weight audit): lower
    assert t["harness_overhead"]["per_prompt"] == [x["per_prompt_overhead_ratio"] for x in h]
    assert all(x["per_prompt_overhead_ratio"] < x["overhead_ratio"] for x in h if x["phases"].get("weight_audit"))
    assert all(x["per_prompt_overhead_ratio"] <= x["overhead_ratio"] for x in h)
    sm = t["streaming_memory"]
    assert sm["flat_layers"] == [2, 4] and 0.9 < sm["flat_ratio"] < 1.5 and sm["bound_bytes"] > 2 * 2 ** 30
    assert d["build"]["official"]["bytes"] > 0 and len(d["build"]["nvidia-nvfp4"]["per_layer_bytes"]) == 4
    # the probe-capture cost is measured per native backend, and on a CPU says why there is nothing to copy
    assert [(x["backend"], x["tokens"]) for x in d["probe_capture"]] == [("emulated", 32)]
    assert "nothing is copied" in d["probe_capture"][0]["skipped"]


@pytest.mark.gpu
def test_probe_capture_cost_on_the_gpu() -> None:
    """Pageable synchronous and pinned non-blocking captures hold the same probes, bytes counted."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import dsv4
    from probe_capture_cost import probe_capture_cost

    m = dsv4.load_model("tiny-trained", backend="emulated", device="cuda")
    r = probe_capture_cost(m, torch.randint(2, 1000, (48,)), "cuda")
    assert r["pinned_equal"] and r["probes"] > 10 and r["host_bytes"] > 48 * 4
    assert r["plain_seconds"] > 0 and r["pageable_sync_seconds"] > 0 and r["pinned_async_seconds"] > 0


def test_bad_prefill_is_one_clear_error() -> None:
    r = subprocess.run([sys.executable, str(BENCH / "bench_real_width.py"), "--prefill", "1k", "--out", "/tmp/x.json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "expected comma-separated integers, found '1k'" in r.stderr


def test_a_prefill_past_the_models_positions_is_refused_before_any_build(tmp_path) -> None:
    """tiny holds 1,024 positions: an 8k prefill is one clear error, and no checkpoint is written."""
    r = subprocess.run([sys.executable, str(BENCH / "bench_real_width.py"), "--width", "tiny", "--prefill", "8192",
                        "--device", "cpu", "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "x.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "expected lengths <= 1024" in r.stderr and "found 8192" in r.stderr
    assert not (tmp_path / "w").exists()


@pytest.fixture
def results(tiny_run, tmp_path, monkeypatch) -> Path:
    from parity import verdict_time

    (tmp_path / "real_width_tiny.json").write_text(json.dumps(tiny_run))
    monkeypatch.setattr(verdict_time, "RESULTS", tmp_path)
    return tmp_path


def test_estimate_names_its_table_and_every_scaling_assumption(results) -> None:
    from dsv4.config import preset
    from parity.verdict_time import estimate, this_card

    here = estimate(preset("tiny"), [32, 64], ["logic", "floor"])
    assert here is not None and here.table_card == this_card() == here.card and here.seconds > 0
    assert not any("no measured table" in a for a in here.assumptions)
    assert set(here.breakdown) == {"logic", "floor", "loads"}
    h100 = estimate(preset("flash"), [1024], ["floor"], card="NVIDIA H100 80GB HBM3")
    h200 = estimate(preset("flash"), [1024], ["floor"], card="NVIDIA H200")
    text = " ".join(h100.assumptions)
    assert "no measured table for this machine (NVIDIA H100 80GB HBM3)" in text and "memory bandwidth" in text
    assert "parameters per layer flash" in text and "linear in tokens" in text
    # only the bandwidth differs, and it scales the forwards, not the loads (the checkpoint's read rate)
    assert h100.breakdown["floor"] / h200.breakdown["floor"] == pytest.approx(4.8 / 3.35, rel=1e-9)
    assert h100.breakdown["loads"] == pytest.approx(h200.breakdown["loads"], rel=1e-9)


def test_dry_run_prints_the_time_to_verdict_beside_the_memory_plan(results, tmp_path) -> None:
    from parity.first_token import main

    out = tmp_path / "dry.json"
    assert main(["--checkpoint", "flash", "--dry-run", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["dry_run"]["peak_per_device"] and d["time_to_verdict"]["seconds"] > 0
    assert any("parameters per layer flash" in a for a in d["time_to_verdict"]["assumptions"])


def test_dry_run_without_a_table_says_so(tmp_path, monkeypatch, capsys) -> None:
    from parity import verdict_time
    from parity.first_token import main

    monkeypatch.setattr(verdict_time, "RESULTS", tmp_path)
    assert main(["--checkpoint", "flash", "--dry-run"]) == 0
    assert "time to verdict: no measured per-layer table" in capsys.readouterr().out


def test_table_script_writes_measured_and_extrapolated_markdown(results, tmp_path) -> None:
    md = tmp_path / "rw.md"
    r = subprocess.run([sys.executable, str(BENCH / "real_width_table.py"), str(results / "real_width_tiny.json"),
                        "--out", str(md)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    text = md.read_text()
    assert "| reference(streaming) | prefill | 64 | hca/score |" in text and "harness overhead" in text
    assert "| peak GPU GiB | host RSS GiB | disk read GiB |" in text and "lifetime peak" in text
    for row in ("| flash | logic + floor + bug_budget | 1x H100 |", "| pro | floor + bug_budget | 8x B200, prompts "
                "over 8 ranks (torchrun) |", "| pro | floor + bug_budget | 8x B200, one process, layers by device map |"):
        assert row in text
    assert "no measured table for this machine (NVIDIA B200)" in text
    # at full size one H100 cannot hold Pro's NVFP4 model: it streams there (dsv4.streamed), its re-reads
    # counted; the logic column's FP32 layers are too large to stream on it, and a device map needs 88
    assert re.search(r"\| pro \| floor \+ bug_budget \| 1x H100 \| [\d.]+ (h|min) \| streamed: native default \(floor / "
                     r"bug budget\) streamed", text)
    assert "| pro | logic + floor + bug_budget | 1x H100 | **needs 88 x H100** by device map:" in text
    assert "cannot stream: native all-fp32 (logic): its embedding, head and largest layer" in text
    # prompts over ranks, one B200 each: every rank streams Pro's model on its own card
    assert re.search(r"\| pro \| floor \+ bug_budget \| 8x B200, prompts over 8 ranks \(torchrun\) \| [\d.]+ (h|min) \| "
                     r"streamed: native default \(floor / bug budget\) streamed", text)
    # the decode and floor-search rows (parity.verdict_time_runs), each with its breakdown
    for row in ("| decode | flash | 1x H100 |", "| floor search | pro | 8x B200, configurations over 8 ranks"):
        assert row in text
    assert "native_decode" in text and "configurations" in text and "300-token teacher-forced decode" in text


def test_pick_table_prefers_the_models_own_table() -> None:
    """With Flash and Pro tables from one card, each model is estimated from its own shapes (no
    parameter scaling); another card takes the same model's table too."""
    from parity.verdict_time import pick_table

    card = "NVIDIA H100 80GB HBM3"
    flash = {"model": "flash", "machine": {"card": card}, "wall_s": 200, "_file": "f.json"}
    pro = {"model": "pro", "machine": {"card": card}, "wall_s": 300, "_file": "p.json"}
    for order in ([flash, pro], [pro, flash]):
        assert pick_table(order, card, "flash") == (flash, [])
        assert pick_table(order, card, "pro") == (pro, [])
        t, notes = pick_table(order, "NVIDIA H200", "flash")
        assert t is flash and "scaled from NVIDIA H100 80GB HBM3 (f.json)" in notes[0]
    assert pick_table([flash, pro], card, "tiny")[0] is pro     # no table of the model: the last listed
    # of two tables of one model, the more recent: its date, else the later file (real_width_pro_h100_s3 after _s2)
    s2 = {"model": "pro", "machine": {"card": card}, "wall_s": 400, "_file": "s2.json"}
    s3 = {"model": "pro", "machine": {"card": card}, "wall_s": 300, "_file": "s3.json"}
    assert pick_table([s2, s3], "NVIDIA B200", "pro")[0] is s3 and pick_table([s2, s3], card, "pro")[0] is s3
    dated = [{**s3, "date": "2026-12-01T00:00:00Z"}, {**s2, "date": "2026-12-07T00:00:00Z"}]
    assert pick_table(dated, "NVIDIA B200", "pro")[0] is dated[1] and pick_table(dated, card, "pro")[0] is dated[1]


def test_pick_table_prefers_a_complete_table_to_a_more_recent_partial_one() -> None:
    """A later run of the reference alone (memory flatness) or of a long prefill without the harness
    cannot give an estimate: the complete table is picked, on its card and on another."""
    from parity.verdict_time import complete, pick_table

    card = "NVIDIA H100 80GB HBM3"

    def run(side: str, backend: str) -> dict:
        return {"side": side, "backend": backend, "phase": "prefill", "tokens": 1024}

    whole = {"model": "flash", "machine": {"card": card}, "_file": "a.json", "date": "2026-12-01T00:00:00Z",
             "runs": [run("reference", "reference(streaming)"), run("native", "emulated"),
                      run("native", "cutedsl_sm90")], "harness": [{"overhead_ratio": 1.0}]}
    ref_only = {**whole, "_file": "b.json", "date": "2026-12-07T00:00:00Z", "runs": whole["runs"][:1], "harness": []}
    no_harness = {**whole, "_file": "c.json", "date": "2026-12-07T01:00:00Z", "harness": [{"overhead_ratio": None}]}
    assert complete(whole) and not complete(ref_only) and not complete(no_harness)
    for order in ([whole, ref_only, no_harness], [no_harness, ref_only, whole]):
        assert pick_table(order, card, "flash")[0] is whole
        assert pick_table(order, "NVIDIA H200", "flash")[0] is whole


def test_table_shows_the_probe_capture_cost(tiny_run, tmp_path) -> None:
    d = json.loads(json.dumps(tiny_run))
    d["probe_capture"].append({"backend": "cutedsl_sm90", "tokens": 1024, "probes": 40, "host_bytes": 3 * 2 ** 30,
                               "plain_seconds": 0.14, "pageable_sync_seconds": 0.9, "pinned_async_seconds": 0.3,
                               "pinned_equal": True})
    (tmp_path / "rw.json").write_text(json.dumps(d))
    r = subprocess.run([sys.executable, str(BENCH / "real_width_table.py"), str(tmp_path / "rw.json")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| cutedsl_sm90 | 1024 | 40 | 3.00 | 0.140 | 0.900 | 0.300 | True |" in r.stdout
    assert "| emulated | 32 |" not in r.stdout.split("| probe capture |")[1]   # the CPU entry says why, not a row


def test_estimate_counts_the_weight_audit_once_where_the_table_measured_a_prompts_own_overhead(tiny_run) -> None:
    """A table with ``per_prompt_overhead_ratio`` multiplies the forwards by that ratio and adds its weight
    audit once per checkpoint (whatever the prompt count); an older table's whole-run ratio stays as it was."""
    import copy

    from dsv4.config import preset
    from parity.verdict_time import estimate

    t = copy.deepcopy(tiny_run)
    t["_file"] = "real_width_tiny.json"
    t["runs"] += [{**copy.deepcopy(r), "backend": "cutedsl_sm90"} for r in tiny_run["runs"]
                  if r["side"] == "native" and r["backend"] == "emulated" and r["phase"] == "prefill"]
    L = t["config"]["num_hidden_layers"]
    for h in t["harness"]:
        h.update(overhead_ratio=3.0, per_prompt_overhead_ratio=0.5)
        h["phases"]["weight_audit"] = 2.0 * L                         # 2 s a layer
    card, cfg = t["machine"]["card"], preset("tiny")
    one, five = (estimate(cfg, [64] * n, ["floor", "bug_budget"], card=card, tables=[t]) for n in (1, 5))
    assert one.breakdown["weight_audit"] == five.breakdown["weight_audit"] == pytest.approx(2.0 * cfg.num_hidden_layers)
    assert five.breakdown["floor"] == pytest.approx(5 * one.breakdown["floor"])       # forwards: per prompt
    old = copy.deepcopy(t)
    for h in old["harness"]:
        del h["per_prompt_overhead_ratio"]
    legacy = estimate(cfg, [64], ["floor", "bug_budget"], card=card, tables=[old])
    assert "weight_audit" not in legacy.breakdown
    assert legacy.breakdown["floor"] == pytest.approx(one.breakdown["floor"] * 4.0 / 1.5)   # x (1+3) against x (1+0.5)
    assert any("per prompt x 1.50" in a for a in one.assumptions)
    # the loads count native model builds: the floor's, which the bug-budget column then runs on its kernel
    # backend; the weight audit reads that model
    assert one.breakdown["loads"] == pytest.approx(legacy.breakdown["loads"])
    assert any("1 native load at" in a for a in one.assumptions)
