"""The attribution study on tiny with two throw-away faults of known nature:

* ``pf_fp4_head_gain``: a bug in the FP4 LM-head path only (its logits x1.5; a BF16 head is untouched) —
  the logic column cannot see it and promoting lm_head "fixes" it: the study must say *misattributed*
  and blame ``lm_head``;
* ``pf_head_gain``: the same gain in every format — the logic column flags it, and promoting lm_head
  fixes nothing.
"""
from __future__ import annotations

from typing import Any, Iterator

import pytest

from dsv4.layers.linear import Linear
from dsv4.plan import PrecisionPlan
from parity.bugzoo.registry import FaultTargetError, patched, register_fault, unregister_fault
from precision_floor.attribution import FaultLoaders, run_attribution
from precision_floor.cache import EvalStore
from precision_floor.evaluate import Evaluator
from precision_floor.search import Budget

GAIN = 1.5


def _gain(model: Any, fp4_only: bool) -> Any:
    lin = model.head_module.lm_head
    if fp4_only and lin.fmt != "fp4":
        raise FaultTargetError(f"{lin.name}: not fp4 in plan {model.plan.name!r}")
    return patched(model.head_module, "lm_head", lambda x: lin(x) * GAIN)


@pytest.fixture(scope="module")
def faults():
    @register_fault("pf_fp4_head_gain", layer=None, component="lm_head", column="bug_budget",
                    description="FP4 LM head output scaled by 1.5 (a wrong global scale in the FP4 path).")
    def fp4_head_gain(model: Any) -> Iterator[None]:
        with _gain(model, True):
            yield

    @register_fault("pf_head_gain", layer=None, component="lm_head", column="logic",
                    description="LM head output scaled by 1.5 in every format.")
    def head_gain(model: Any) -> Iterator[None]:
        with _gain(model, False):
            yield

    yield [fp4_head_gain, head_gain]
    unregister_fault("pf_fp4_head_gain")
    unregister_fault("pf_head_gain")


def test_fault_loaders_apply_and_undo(tiny, faults) -> None:
    loaders = FaultLoaders(faults[0])
    path = str(tiny.path)
    m1 = loaders.native(path, plan="all-fp4", backend="emulated", device="cpu", device_map=None)
    assert not isinstance(m1.head_module.lm_head, Linear)    # the patch (a wrapper) is in place
    m2 = loaders.native(path, plan="all-bf16", backend="emulated", device="cpu", device_map=None)
    assert isinstance(m1.head_module.lm_head, Linear)        # undone when the next model was built
    assert isinstance(m2.head_module.lm_head, Linear)        # not applicable: BF16 head
    assert loaders.applied == {"all-fp4": {"applied": True, "reason": ""},
                               "all-bf16": {"applied": False, "reason": loaders.applied["all-bf16"]["reason"]}}
    loaders.close()


@pytest.mark.slow   # a fault study (~8 s)
def test_study_separates_misattribution_from_a_caught_bug(tmp_path, tiny, prompts, faults) -> None:
    ev = Evaluator(tiny, prompts, EvalStore(tmp_path))
    rescue_head = PrecisionPlan.preset("all-fp4").replace(lm_head="bf16")
    fp4_rescue = ev.score(rescue_head)
    result = run_attribution(ev, faults, budget=Budget(kl=fp4_rescue.kl * 1.01, top1=0.0),
                             classes=("lm_head", "attn_kv"), directions=("rescue",))
    assert not result.clean_logic_flags and result.clean_floor == ["lm_head"]
    rows = result.frame().set_index("fault")
    mis, caught = rows.loc["pf_fp4_head_gain"], rows.loc["pf_head_gain"]

    assert not mis["logic_flags"]
    assert mis["excess_kl"] > 2 * mis["excess_kl_se"] > 0
    assert mis["rescue_fixes"] == ["lm_head"]
    # the FP4-only fault patches neither the FP32 logic model nor the plan with a BF16 head
    assert "all-fp32" in mis["not_applicable_plans"] and rescue_head.name in mis["not_applicable_plans"]
    assert mis["verdict"] == "misattributed" and "lm_head" in mis["blamed"]

    assert caught["logic_flags"] and caught["logic_divergence"]
    assert caught["rescue_fixes"] == []
    assert caught["verdict"] == "caught by logic"
    assert result.to_json()["faults"][0]["fault"] == "pf_fp4_head_gain"


def test_kept_records_give_the_full_verdict(tiny, prompts) -> None:
    """The store keeps a subset of the harness's records; judging the subset must give the same
    failed rules as judging everything (here: a zoo fault the logic column catches)."""
    from parity.bugzoo import get_fault
    from parity.records import to_frame
    from parity.rules import load_rules
    from parity.threeway import RunSpec, run_threeway
    from parity.verdict import evaluate
    from precision_floor.evaluate import keep_record

    loaders = FaultLoaders(get_fault("attention_sink_dropped"))
    spec = RunSpec(source=tiny, prompts=prompts[:2], plan=PrecisionPlan.preset("all-bf16"), columns=("logic",),
                   modes=("propagated", "isolated"))
    records = run_threeway(spec, loaders).records
    loaders.close()
    kept = [r for r in records if keep_record(r, curves=True)]
    assert len(kept) < len(records) / 2
    rules = load_rules()
    full, sub = evaluate(to_frame(records), rules), evaluate(to_frame(kept), rules)
    assert not full.pair_passed("logic")
    assert [o.rule.describe() for o in sub.failed_rules] == [o.rule.describe() for o in full.failed_rules]
    assert sub.first_divergence["logic"] == full.first_divergence["logic"]
