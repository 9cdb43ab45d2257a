"""The harness streams the native model exactly when it is larger than its one device
(``fit_check.streams_native`` through ``DefaultLoaders.native``), runs every prompt's forwards, both
modes, layer by layer (one pass a column), and a streamed run's records equal those of the model built whole;
what the streamed forwards built is kept in the column's description."""
from __future__ import annotations

import pytest

import dsv4.streamed as streamed
from dsv4.plan import PrecisionPlan
from parity import fit_check
from parity.threeway import RunSpec, run_threeway


def _keys(result, pair):
    return sorted((r["compare_mode"], r["prompt_id"], r["probe"], r["metric"], str(r.get("position")), r["value"])
                  for r in result.records if r["metric"] != "seconds" and r["pair"] == pair)


def _printed(result) -> str:
    """The columns' lines first_token prints."""
    import io

    from rich.console import Console

    from parity.records import to_frame
    from parity.render import columns_table
    from parity.rules import load_rules
    from parity.verdict import evaluate

    console = Console(file=io.StringIO(), width=400)
    columns_table(console, result.columns, evaluate(to_frame(result.records), load_rules()))
    return console.file.getvalue()


def _order(result, pair):
    """The comparisons' records in order (the per-call audit's come in call order, which layer by layer differs)."""
    return [(r["prompt_id"], r["compare_mode"], r["probe"], r["metric"], str(r.get("position")))
            for r in result.records if r["pair"] == pair and r["compare_mode"] != "audit"]


def test_the_harness_streams_a_model_larger_than_its_device(tiny, chat_prompts, monkeypatch) -> None:
    spec = RunSpec(source=tiny, prompts=chat_prompts, device="cpu", columns=("logic", "floor"))
    whole_run = run_threeway(spec).raise_errors()
    assert all("streamed" not in c.test_describe for c in whole_run.columns.values())
    monkeypatch.setattr(streamed, "default_resident_bytes", lambda d: 0)
    for col, plan in (("logic", "all-fp32"), ("floor", "default")):
        need, _, _ = fit_check.streamed_floor(tiny.config, PrecisionPlan.preset(plan))
        monkeypatch.setattr(fit_check, "device_memory", lambda d: need)   # a "device" holding one layer at a time
        run = run_threeway(RunSpec(source=tiny, prompts=chat_prompts, device="cpu", columns=(col,))).raise_errors()
        st = run.columns[col].test_describe["streamed"]
        # one pass a column: every prompt's forwards, both modes, share each built layer (layer_major_column)
        assert st["resident_layers"] == [] and st["builds"] == st["layers"], st
        assert len(_keys(whole_run, col)) > 100 and _keys(run, col) == _keys(whole_run, col)
        assert _order(run, col) == _order(whole_run, col)          # in the same order, too
        assert f"streamed: 0 of {st['layers']} layers resident, {st['builds']} layer builds" in _printed(run)


def test_a_streamed_teacher_forced_decode_runs_layer_major_with_the_same_logits(tiny, chat_prompts,
                                                                                   monkeypatch) -> None:
    """parity.decode on a streamed native model: each layer built once for the whole decode (not once a
    step), the native logits and probes equal to the model built whole."""
    import torch

    from parity.decode.run import DecodeSpec, run_decode

    spec = DecodeSpec(source=tiny, prompts=chat_prompts[:1], plan=PrecisionPlan.preset("default"), tokens=12,
                      backend="emulated")
    whole = run_decode(spec).results[0].native
    builds = []
    real = streamed.load_streamed_model

    def counted(*a, **k):
        m = real(*a, **k)
        builds.append(m)
        return m

    monkeypatch.setattr(streamed, "load_streamed_model", counted)
    monkeypatch.setattr(streamed, "default_resident_bytes", lambda d: 0)
    need, _, _ = fit_check.streamed_floor(tiny.config, PrecisionPlan.preset("default"))
    monkeypatch.setattr(fit_check, "device_memory", lambda d: need)
    got = run_decode(spec).results[0].native
    assert len(builds) == 1 and builds[0].blocks.stats()["builds"] == tiny.config.num_hidden_layers
    assert torch.equal(got.logits, whole.logits) and got.targets == whole.targets
    assert got.probes.keys() == whole.probes.keys() and all(
        torch.equal(got.probes[s][k], whole.probes[s][k]) for s in whole.probes for k in whole.probes[s])


def test_a_streamed_bug_budget_column_is_audited_like_the_whole_model(tiny, chat_prompts, monkeypatch) -> None:
    """The floor column's streamed model runs the bug-budget column on the kernel backend (reused, not
    built again): the weight audit walks its layers one at a time, every kernel call is audited, and the
    records (audit ones included) equal the whole model's."""
    pytest.importorskip("tiled_gemm_backend")
    spec = RunSpec(source=tiny, prompts=chat_prompts, backend="tiled_gemm", device="cpu",
                   columns=("floor", "bug_budget"))
    whole_run = run_threeway(spec).raise_errors()
    monkeypatch.setattr(streamed, "default_resident_bytes", lambda d: 0)
    need, _, _ = fit_check.streamed_floor(tiny.config, PrecisionPlan.preset("default"))
    monkeypatch.setattr(fit_check, "device_memory", lambda d: need)
    run = run_threeway(spec).raise_errors()
    L, P = tiny.config.num_hidden_layers, len(chat_prompts)
    bb = run.columns["bug_budget"]
    assert bb.test_describe["backend"] == "tiled_gemm" and not bb.kernels_missing
    assert bb.weight_audit == whole_run.columns["bug_budget"].weight_audit
    assert bb.audit["calls"] == whole_run.columns["bug_budget"].audit["calls"] > 0
    # one model for both columns: a pass for the floor column, the audit's walk, a pass for the bug budget's
    assert bb.test_describe["streamed"]["builds"] == 3 * L and P > 1
    for col in ("floor", "bug_budget"):
        assert len(_keys(whole_run, col)) > 100 and _keys(run, col) == _keys(whole_run, col)
        assert _order(run, col) == _order(whole_run, col)          # in the same order, too


@pytest.mark.gpu
def test_on_the_gpu_a_streamed_run_gives_the_whole_models_records(tiny, chat_prompts, monkeypatch) -> None:
    """The same on a GPU with its kernel backend (cutedsl_sm90 on Hopper): floor and bug-budget columns
    streamed layer by layer, records (audit included) equal to the model built whole."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    from parity.threeway import resolve_kernel_backend

    kernel, reason = resolve_kernel_backend("auto", "cuda")
    if kernel is None:
        pytest.skip(f"needs a CUDA GPU with a kernel backend: {reason}")
    spec = RunSpec(source=tiny, prompts=chat_prompts, backend=kernel, device="cuda", columns=("floor", "bug_budget"))
    whole_run = run_threeway(spec).raise_errors()
    monkeypatch.setattr(streamed, "default_resident_bytes", lambda d: 0)
    need, _, _ = fit_check.streamed_floor(tiny.config, PrecisionPlan.preset("default"))
    monkeypatch.setattr(fit_check, "device_memory", lambda d: need)
    run = run_threeway(spec).raise_errors()
    assert run.columns["bug_budget"].test_describe["streamed"]["builds"] == 3 * tiny.config.num_hidden_layers
    for col in ("floor", "bug_budget"):
        assert _keys(run, col) == _keys(whole_run, col) and _order(run, col) == _order(whole_run, col)


def test_a_reference_reading_its_checkpoint_runs_every_prompt_layer_by_layer(tiny, chat_prompts, monkeypatch) -> None:
    """A reference that reads its weights from the checkpoint on every forward (no weight cache: every
    real-size one) runs the prompts layer by layer, each layer read once for all of them: the same
    anchors and records as prompt by prompt."""
    import reference.model as ref_model

    from parity import threeway

    spec = RunSpec(source=tiny, prompts=chat_prompts, device="cpu", columns=("floor",))
    whole_run = run_threeway(spec).raise_errors()
    calls: list[int] = []
    real = threeway.run_prompts_layer_major

    def counted(model, ids, *a, **k):
        calls.append(len(ids))
        return real(model, ids, *a, **k)

    monkeypatch.setattr(threeway, "run_prompts_layer_major", counted)
    monkeypatch.setattr(ref_model, "AUTO_CACHE_BYTES", 0)            # as a real-size checkpoint: streamed
    run = run_threeway(spec).raise_errors()
    assert calls == [len(chat_prompts)]                              # the reference's prompts, once, together
    assert _keys(run, "floor") == _keys(whole_run, "floor") and _order(run, "floor") == _order(whole_run, "floor")
    assert [f.prompt_id for f in run.forwards if f.side.startswith("reference")] == [p.id for p in chat_prompts]
