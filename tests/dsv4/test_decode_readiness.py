"""The CUDA-graph readiness detector: its pure logic on the CPU (stack -> source location, warning
capture, step-to-step op-trace diffs, report rendering, the CUDA-only CLI's refusal), and the full
check on an H200 (``gpu`` + ``sm90``; logs to ``$OUT`` when set)."""
from __future__ import annotations

import io
import json
import os
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from rich.console import Console

import dsv4
from dsv4.decode import readiness
from dsv4.decode.optrace import OpEvent, diff_steps, diff_many, trace_steps
from dsv4.decode.readiness import CaptureAttempt, Report, SyncRecorder, group_syncs, render
from dsv4.decode.where import PACKAGE_ROOT, source_location

HERE = Path(__file__).resolve().parent


def _frame(path: str, line: int, name: str = "f") -> traceback.FrameSummary:
    return traceback.FrameSummary(path, line, name, line="x = y")


# ---- stack -> source location ---------------------------------------------------------------------
def test_source_location_is_the_innermost_frame_inside_the_package() -> None:
    pkg = str(PACKAGE_ROOT)
    stack = [_frame("/usr/lib/python3.11/runpy.py", 10), _frame(f"{pkg}/model.py", 300, "decode_step"),
             _frame(f"{pkg}/layers/attention.py", 99, "attend"), _frame("/site-packages/torch/_tensor.py", 5)]
    loc = source_location(stack)
    assert (loc.path, loc.line, loc.function) == ("dsv4/layers/attention.py", 99, "attend")
    assert str(loc) == "dsv4/layers/attention.py:99 (attend)"


def test_observer_frames_are_never_the_culprit() -> None:
    pkg = str(PACKAGE_ROOT)
    stack = [_frame(f"{pkg}/layers/moe.py", 42, "dispatch"), _frame(f"{pkg}/decode/readiness.py", 1, "check")]
    assert source_location(stack).path == "dsv4/layers/moe.py"
    assert source_location([_frame("/elsewhere/x.py", 1)]) is None


def _host_read() -> None:
    warnings.warn("called a synchronizing CUDA operation", UserWarning)   # what torch's sync debug says


def _unrelated() -> None:
    warnings.warn("something else entirely", UserWarning)


def test_sync_recorder_keeps_a_stack_per_matching_warning_and_passes_others_on() -> None:
    with pytest.warns(UserWarning, match="something else"):
        with SyncRecorder(mode=None, root=HERE) as rec:
            _host_read()
            _host_read()          # the same line twice: both recorded ("always"), not deduplicated
            _unrelated()
    assert len(rec.events) == 2
    loc = rec.events[0].location
    assert loc.path.endswith("test_decode_readiness.py") and loc.function == "_host_read"
    (where, count, chain), = group_syncs(rec.events)
    assert count == 2 and where == str(loc) and "test_decode_readiness.py" in chain


# ---- op-trace diffs -----------------------------------------------------------------------------------
def _ev(op: str, loc: str, shapes=((1, 4),), scalars=(), devices=("cuda:0", "cuda:0")) -> OpEvent:
    return OpEvent(op, loc, tuple(shapes), tuple(scalars), tuple(devices))


def test_diff_finds_shape_scalar_control_flow_data_dependent_and_host_copies() -> None:
    a = [_ev("aten.cat.default", "dsv4/layers/kv_cache.py:30 (cat)", [(5, 8)]),
         _ev("aten.arange.start", "dsv4/layers/attention.py:147 (__call__)", [(1,)], (57, 58)),
         _ev("aten.mul.Tensor", "dsv4/layers/mhc.py:10 (mix)", scalars=(float("nan"),)),
         _ev("aten.bincount.default", "dsv4/layers/moe.py:42 (dispatch)", [(8,)]),
         _ev("aten._to_copy.default", "dsv4/model.py:270 (embed)", [(1,)], devices=("cpu", "cuda:0"))]
    b = [_ev("aten.cat.default", "dsv4/layers/kv_cache.py:30 (cat)", [(6, 8)]),
         _ev("aten.arange.start", "dsv4/layers/attention.py:147 (__call__)", [(1,)], (58, 59)),
         _ev("aten.mul.Tensor", "dsv4/layers/mhc.py:10 (mix)", scalars=(float("nan"),)),   # NaN == NaN here
         _ev("aten.bincount.default", "dsv4/layers/moe.py:42 (dispatch)", [(8,)]),
         _ev("aten._to_copy.default", "dsv4/model.py:270 (embed)", [(1,)], devices=("cpu", "cuda:0")),
         _ev("aten.add.Tensor", "dsv4/layers/compressor.py:61 (pool)")]
    got = {(f.kind, f.location): f for f in diff_steps(a, b)}
    assert set(got) == {("step_shape", "dsv4/layers/kv_cache.py:30 (cat)"),
                        ("step_scalar", "dsv4/layers/attention.py:147 (__call__)"),
                        ("data_dependent", "dsv4/layers/moe.py:42 (dispatch)"),
                        ("host_copy", "dsv4/model.py:270 (embed)"),
                        ("control_flow", "dsv4/layers/compressor.py (pool)")}
    assert got[("step_shape", "dsv4/layers/kv_cache.py:30 (cat)")].detail == "[(5, 8)] -> [(6, 8)]"
    assert got[("step_scalar", "dsv4/layers/attention.py:147 (__call__)")].detail == "57->58, 58->59"
    assert got[("data_dependent", "dsv4/layers/moe.py:42 (dispatch)")].count == 2      # once per step
    assert "second step only" in got[("control_flow", "dsv4/layers/compressor.py (pool)")].detail


def test_identical_steps_have_no_findings() -> None:
    a = [_ev("aten.mm.default", "dsv4/layers/linear.py:150 (__call__)")]
    assert diff_steps(a, list(a)) == []


def test_trace_of_the_real_model_on_cpu_names_the_position_dependent_code() -> None:
    torch.set_num_threads(1)
    m = dsv4.load_model("tiny", plan="default", backend="emulated")
    ids = (torch.arange(30, dtype=torch.int64) * 7 + 3) % 512
    with torch.no_grad():
        _, state = m.prefill(ids)
    traces = trace_steps(m, state, [5] * 5)          # 5 steps: a CSA block (4) closes in between
    found = {(f.kind, f.location.split(":")[0] if f.kind != "control_flow" else f.location, f.op)
             for f in diff_many(traces)}
    kinds = {k for k, _, _ in found}
    assert {"step_scalar", "step_shape", "data_dependent", "control_flow"} <= kinds
    assert ("step_scalar", "dsv4/layers/attention.py", "arange.start") in found         # positions = arange(start)
    # the MoE dispatch counts by a scatter: nothing in moe.py depends on the data's values for its shapes
    assert not any(k == "data_dependent" and loc == "dsv4/layers/moe.py" for k, loc, _ in found)
    assert any(k == "step_shape" and loc == "dsv4/layers/compressor.py" for k, loc, _ in found)   # the open block
    assert any(k == "control_flow" and loc.startswith("dsv4/layers/compressor.py") for k, loc, _ in found)


# ---- the report -----------------------------------------------------------------------------------
def _report(**over) -> Report:
    from dsv4.decode.optrace import Finding

    rep = Report("tiny", "default", "cutedsl_sm90", "cuda:0",
                 syncs=[("dsv4/layers/attention.py:99 (attend)", 4, "model.py:300")],
                 findings=[Finding("step_scalar", "dsv4/layers/attention.py:147 (__call__)", "arange.start",
                                   "57->58", 4)],
                 capture=CaptureAttempt(False, "RuntimeError: operation not permitted when stream is capturing",
                                        "dsv4/model.py:270 (embed)"),
                 segments=[{"name": "L0.attn_pre", "pieces": ("L0.attn_pre",), "device": "cuda:0", "stream": 0,
                            "mode": "graph", "reason": ""},
                           {"name": "L0.attn_core", "pieces": ("L0.attn_core",), "device": "cuda:0", "stream": 0,
                            "mode": "eager", "reason": "eager by design"}],
                 graph_matches_eager=True)
    for k, v in over.items():
        setattr(rep, k, v)
    return rep


def _text(rep: Report) -> str:
    buf = io.StringIO()
    render(Console(file=buf, width=200), rep)
    return buf.getvalue()


def test_render_lists_every_violation_with_its_location() -> None:
    out = _text(_report())
    for needle in ("dsv4/layers/attention.py:99 (attend)", "position-dependent scalar baked in",
                   "whole-step capture: fails at dsv4/model.py:270 (embed)", "L0.attn_pre", "eager by design",
                   "graph logits == eager logits (bitwise): yes", "READY"):
        assert needle in out, needle
    assert _report().ready


def test_a_fallback_or_a_mismatch_is_not_ready() -> None:
    seg = {"name": "L0.ffn", "pieces": ("L0.ffn",), "device": "cuda:0", "stream": 0, "mode": "eager",
           "reason": "capture failed: RuntimeError: ... at dsv4/numerics/nvfp4.py:40 (check_global_scale)"}
    rep = _report(segments=_report().segments + [seg])
    assert not rep.ready and len(rep.fallbacks) == 1
    assert "NOT READY: 1 capturable segment(s) run eagerly" in _text(rep)
    assert not _report(graph_matches_eager=False).ready
    d = rep.to_dict()
    assert d["ready"] is False and d["fallbacks"] == 1 and d["findings"][0]["kind"] == "step_scalar"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the CPU refusal is not reachable")
def test_cli_on_cpu_explains_that_it_needs_cuda_and_exits_2() -> None:
    buf = io.StringIO()
    rc = readiness.main([], console=Console(file=buf, width=200))
    assert rc == 2 and "needs a CUDA device" in buf.getvalue()
    assert readiness.main(["--device", "cpu"], console=Console(file=io.StringIO())) == 2


# ---- on the H200 ------------------------------------------------------------------------------------
def _out(name: str) -> str | None:
    out = os.environ.get("OUT")
    return str(Path(out) / name) if out else None


@pytest.mark.gpu
@pytest.mark.sm90
def test_readiness_on_hopper_kernels_is_ready(tmp_path: Path) -> None:
    from .test_decode_graphs import shared_sm90   # kernels compiled once per process

    js = _out("readiness_sm90.json") or str(tmp_path / "r.json")
    buf = io.StringIO()
    rc = readiness.main(["--device", "cuda:0", "--backend", shared_sm90(), "--json", js],
                        console=Console(file=buf, width=220))
    log = _out("readiness_sm90.log")
    if log:
        Path(log).write_text(buf.getvalue())
    rep = json.loads(Path(js).read_text())
    assert rc == 0, buf.getvalue()
    assert rep["ready"] and rep["graph_matches_eager"]
    assert rep["syncs"], "an eager decode_step host-syncs (the kernels' contract checks of offsets)"
    # none left in the attention core and the MoE dispatch, the eager pieces of a graph decode step (the
    # window bounds come from host integers, constants and slot indices are made on the device, the
    # expert counts by a scatter); an H100 run before counted 39 a step there (searchsorted, CPU aranges
    # and torch.tensor constants copied to the GPU, bincount)
    eager_files = ("attention.py", "kv_cache.py", "ue8m0.py", "hadamard.py", "fp8.py", "moe.py", "compressor.py",
                   "indexer.py")
    assert not [s for s in rep["syncs"] if any(f in s[0] for f in eager_files)], rep["syncs"]
    assert rep["capture"]["ok"] is False and rep["capture"]["location"].startswith("dsv4/")
    # every capturable piece of the 4 layers sits in a graph (attn_out, dispatch and ffn chain into the next
    # layer's attn_pre, so there are 5 graph segments, not one per piece)
    graphed = {p for s in rep["segments"] if s["mode"] == "graph" for p in s["pieces"]}
    want = {f"L{i}.{k}" for i in range(4) for k in ("attn_pre", "attn_out", "dispatch", "ffn")} | {"head"}
    assert graphed == want, sorted(want ^ graphed)
    assert torch.randn(8, device="cuda").isfinite().all()   # the failed whole-step capture left CUDA RNG usable


@pytest.mark.gpu
def test_readiness_with_the_emulated_backend_reports_its_host_reads(tmp_path: Path) -> None:
    js = _out("readiness_emulated.json") or str(tmp_path / "r.json")
    buf = io.StringIO()
    rc = readiness.main(["--device", "cuda:0", "--backend", "emulated", "--json", js],
                        console=Console(file=buf, width=220))
    rep = json.loads(Path(js).read_text())
    assert rc == 1, buf.getvalue()          # the emulated FP4 path reads global scales / offsets on the host
    assert rep["graph_matches_eager"] and rep["fallbacks"] > 0
    reasons = " ".join(s["reason"] for s in rep["segments"] if s["mode"] == "eager")
    assert "capture failed" in reasons
    assert torch.randn(8, device="cuda").isfinite().all()   # the failed captures left CUDA RNG usable



def test_the_attention_core_and_dispatch_read_nothing_on_the_host() -> None:
    """Traced on the CPU, a decode step's attention core and MoE dispatch have no op that synchronizes
    on CUDA: no host read of a device value (``item``/``int``, ``bincount``'s size) and no constant made
    on the host (``torch.tensor``: a copy to the GPU). Before, 39 such synchronizations a step came from
    there on an H100 (searchsorted window bounds, bincount, FP8 / Hadamard constants)."""
    torch.set_num_threads(1)
    m = dsv4.load_model("tiny", plan="default", backend="emulated")
    with torch.no_grad():
        _, state = m.prefill((torch.arange(30, dtype=torch.int64) * 7 + 3) % 512)
    events = [e for step in trace_steps(m, state, [5] * 2) for e in step]
    files = ("layers/attention.py", "layers/kv_cache.py", "layers/compressor.py", "layers/indexer.py",
             "layers/moe.py", "numerics/ue8m0.py", "numerics/hadamard.py", "numerics/fp8.py")
    syncing = ("aten._local_scalar_dense", "aten.bincount", "aten.lift_fresh", "aten.nonzero", "aten.searchsorted")
    bad = [(e.op, e.location) for e in events if e.op.startswith(syncing) and any(f in e.location for f in files)]
    assert not bad, bad
    assert any(e.op.startswith("aten._local_scalar_dense") for e in events)   # the tracer sees host reads


def test_the_whole_check_runs_on_the_cpu_with_a_fake_cuda_runtime() -> None:
    """The CUDA path of ``check`` (capture attempt, piecewise decoder, op traces) driven on the CPU by
    the replaying fake runtime of test_decode_graphs_logic.py: no Python error can wait for the GPU."""
    from .test_decode_graphs_logic import FakeRuntime

    torch.set_num_threads(1)
    m = dsv4.load_model("tiny", plan="all-bf16", backend="emulated")
    rep = readiness.check(m, (torch.arange(30, dtype=torch.int64) * 7 + 3) % 512, trace_steps_n=5, streams=1,
                          runtime=FakeRuntime(), sync_mode=None)
    assert rep.capture is not None and not rep.capture.ok
    assert rep.capture.location.startswith("dsv4/config.py") and "check_token_ids" in rep.capture.location
    assert rep.graph_matches_eager is True and not rep.mismatch
    modes = {s["name"]: s["mode"] for s in rep.segments}
    assert modes["L0.attn_pre"] == "graph" and modes["L0.attn_out"] == "eager"
    assert not rep.ready and len(rep.fallbacks) == 8        # attn_out and ffn of 4 layers host-read offsets
    assert not any(f.kind == "data_dependent" and "moe.py" in f.location for f in rep.findings)
    assert all(modes[f"L{i}.dispatch"] == "graph" for i in range(4))   # no host read left in the dispatch
    assert "NOT READY: 8 capturable segment(s) run eagerly" in _text(rep)
