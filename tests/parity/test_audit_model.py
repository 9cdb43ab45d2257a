"""The kernel and weight audit on the tiny model: clean backends give 0 violations, the zoo's subtle
kernel faults give violations at the call they first touch, a violation exports as a repro that
replays without the model, and the bug-budget column is judged by the audit."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.registry import get_backend
from dsv4.model import load_model
from parity.audit import CallAuditor, audit_weights, export_repro, load_repro, replay
from parity.audit.__main__ import main as audit_main
from parity.bugzoo.backends import CLEAN_KERNEL, installed
from parity.bugzoo.kernel_faults import ACT_SCALE, KTAIL, NEXT_ALPHA, SCALE_NEIGHBOUR
from parity.records import to_frame
from parity.rules import load_rules
from parity.threeway import RunSpec, run_threeway
from parity.verdict import evaluate


@pytest.fixture(scope="module")
def ids(tiny):
    return torch.arange(1, 37) % tiny.config.vocab_size


def _audited(tiny, backend_fault, ids):
    with installed(backend_fault) as name:
        model = load_model(str(tiny.path), plan="default", backend=name)
        wa = audit_weights(model)
        auditor = CallAuditor()
        with auditor.attached(model):
            model(ids)
        assert all(not d.taps for d in model.dispatchers.values())   # detached on exit
    return wa, auditor


def test_clean_stand_in_has_no_violation(tiny, ids) -> None:
    wa, auditor = _audited(tiny, CLEAN_KERNEL, ids)
    assert wa.passed and wa.modules > 20 and wa.weights > 10 ** 6
    assert auditor.passed and auditor.calls > 50
    assert 0 < auditor.summary()["worst_ratio"] <= 1.0


def test_weight_scale_fault_is_found_by_both_audits(tiny, ids) -> None:
    wa, auditor = _audited(tiny, SCALE_NEIGHBOUR, ids)
    assert not wa.passed
    first = wa.mismatches[0]
    assert first.module == "layers.0.attn.wq_a" and "codes*scales" in first.passname
    v = auditor.violations[0]
    assert (v.layer, v.component, v.op) == (0, "attn_q", "gemm")


def test_weight_audit_of_a_bank_is_batched_and_finds_the_next_experts_alpha(tiny, monkeypatch) -> None:
    """An expert bank goes through grouped GEMMs of several experts at once; the findings do not depend
    on the batch, and a kernel scaling expert e with e+1's global scale shows in the global-scale pass."""
    from parity.audit import weights

    calls, found = [], {}
    view = weights._bank_view
    for batch_elements in (1 << 26, 1):                         # every expert in one call / one per call
        monkeypatch.setattr(weights, "BATCH_ELEMENTS", batch_elements)
        n = [0]
        monkeypatch.setattr(weights, "_bank_view", lambda *a, n=n: (n.__setitem__(0, n[0] + 1), view(*a))[1])
        with installed(NEXT_ALPHA) as name:
            wa = weights.audit_weights(load_model(str(tiny.path), plan="default", backend=name))
        calls.append(n[0])
        found[batch_elements] = [(m.module, m.expert, m.passname, m.mismatches) for m in wa.mismatches]
    a, b = found.values()
    assert a == b and a
    assert ("layers.0.attn.wo_a", 0, "with global scale") in {x[:3] for x in a}
    assert all(x[2] == "with global scale" for x in a)           # codes and block scales are read right
    assert 0 < calls[0] < calls[1]                               # fewer calls with bigger batches


@pytest.mark.parametrize("fault, op, weights_ok", [(KTAIL, "gemm", False), (ACT_SCALE, "quantize_activation", True)])
def test_call_faults_are_localized_to_their_first_call(tiny, ids, fault, op, weights_ok) -> None:
    wa, auditor = _audited(tiny, fault, ids)
    # a dropped k-tail also drops weight columns from the identity GEMM; a bad activation scale does not
    assert wa.passed == weights_ok
    v = auditor.violations[0]
    assert (v.module, v.op) == ("layers.0.attn.wq_a", op) and v.check.violations > 0


def test_repro_replays_without_the_model(tiny, ids, tmp_path, capsys) -> None:
    _, auditor = _audited(tiny, KTAIL, ids)
    kept = auditor.kept[0]
    path = export_repro(tmp_path / "r.safetensors", kept.call, kept.violation, plan_entry="attn_q = fp4")
    assert path.stat().st_size < 2 * 1024 * 1024
    header, call = load_repro(path)
    assert header["module"] == kept.violation.module and header["call_index"] == kept.violation.call_index
    assert replay(call, get_backend("emulated")).violations == 0
    with installed(KTAIL) as name:
        again = replay(call, get_backend(name))
    assert again.violations == kept.violation.check.violations
    # the CLI: the recorded backend (a zoo stand-in, registered by the CLI itself) fails, emulated passes
    assert audit_main(["replay", str(path)]) == 1
    assert audit_main(["replay", str(path), "--backend", "emulated"]) == 0
    (tmp_path / "bad.safetensors").write_bytes(b"not a repro")
    assert audit_main(["replay", str(tmp_path / "bad.safetensors")]) == 2
    assert "expected a safetensors file" in capsys.readouterr().out


def test_bug_budget_column_is_judged_by_the_audit(tiny, chat_prompts) -> None:
    with installed(KTAIL) as name:
        spec = RunSpec(source=tiny, prompts=chat_prompts[:1], backend=name, columns=("bug_budget",),
                       modes=("isolated",))
        result = run_threeway(spec)
    df = to_frame(result.records)
    audit = df[df["compare_mode"] == "audit"]
    assert set(audit["metric"]) >= {"audit_violations", "weight_mismatches", "audit_calls", "audit_worst_ratio"}
    verdict = evaluate(df, load_rules())
    assert not verdict.pair_passed("bug_budget")
    div = verdict.first_divergence["bug_budget"]
    assert (div.layer, div.component, div.metric) == (0, "attn_q", "audit_violations")
    # the distribution rules of emulated <-> kernel are information once the audit judges the column
    assert not [o for o in verdict.failed_rules if o.rule.pair == "bug_budget" and o.rule.compare_mode != "audit"]
    assert result.columns["bug_budget"].audit["violating_calls"] > 0


def test_run_cli_writes_repros_of_a_violating_backend(tiny, tmp_path, capsys) -> None:
    """`python -m parity.audit run` on a faulty backend: exit 1, the violations named, one repro per
    kept call listed (this path once crashed in the message that lists them)."""
    with installed(KTAIL) as name:
        rc = audit_main(["run", "--checkpoint", "tiny", "--backend", name, "--prompt", "chat-capital",
                         "--out", str(tmp_path / "repros")])
    out = capsys.readouterr().out
    assert rc == 1, out
    files = sorted((tmp_path / "repros").glob("*.safetensors"))
    assert files and f"repro files ({len(files)})" in out and "VIOLATION layers.0." in out
    assert "Traceback" not in out and "internal error" not in out


def test_calls_inside_a_cuda_graph_capture_are_counted_not_judged(tiny, ids, monkeypatch) -> None:
    """During a capture the kernels are recorded, not run, and the replay's host reads are forbidden: such
    calls are counted apart (never an error, never a violation); the next call outside a capture is judged."""
    import parity.audit.auditor as auditor_mod

    with installed(ACT_SCALE) as name:            # a faulty backend: a judged call would be a violation
        model = load_model(str(tiny.path), plan="default", backend=name)
        auditor = CallAuditor()
        with auditor.attached(model):
            monkeypatch.setattr(auditor_mod, "_capturing", lambda: True)
            model(ids)
            captured = auditor.captured
            assert captured > 50 and auditor.calls == 0 and auditor.passed
            monkeypatch.setattr(auditor_mod, "_capturing", lambda: False)
            model(ids)
    assert auditor.captured == captured and auditor.calls > 50 and not auditor.passed
    assert auditor.summary()["captured"] == captured
