"""The native DSpark draft (dsv4.dspark) on the tiny 0731 flavor: built under the plan's draft_*
classes on the target's dispatchers, equal to the reference draft in the FP32 logic plan, lossless
greedy speculation, and clear errors on a checkpoint without DSpark."""
from __future__ import annotations

import pytest
import torch

import reference
from dsv4 import probes
from dsv4.checkpoint.synth import resolve_preset
from dsv4.dspark import load_dspark
from dsv4.model import load_model
from dsv4.probes import DRAFT_PLAN_CLASSES
from reference.dspark import DSparkReference

PROMPT = torch.tensor([1, 5, 9, 33, 70, 12, 100, 7, 3, 44, 61, 2, 90, 17, 8, 250, 4, 33, 19, 6], dtype=torch.int64)


@pytest.fixture(scope="module")
def path() -> str:
    return str(resolve_preset("tiny", flavor="official-dspark", seed=0))


def _draft_probes(ds, state, forced=None):
    logits, mh = ds.trunk(state)
    rings = ds.new_state()
    ds.commit(rings, mh)
    with probes.ProbeRecorder(include=r"^(layers\.[4-6]\.|dspark\.)") as rec:
        d = ds.draft(rings, int(torch.argmax(logits[-1])), forced=forced)
    return d, rec


def test_logic_plan_draft_equals_the_reference_draft_in_fp32(path) -> None:
    native = load_dspark(load_model(path, plan="all-fp32", backend="emulated"))
    ref_model = reference.load_model(path, profile="bf16", dtype=torch.float32)
    dr, rr = _draft_probes(DSparkReference(ref_model), ref_model.new_state(PROMPT))
    dn, rn = _draft_probes(native, native.target.new_state(PROMPT), forced=dr.tokens)
    L = ref_model.config.num_hidden_layers
    want = {f"layers.{L + s}.{p}" for s in range(3) for p in ("attn.q", "attn.kv", "attn.core", "attn.out", "out")}
    want |= {"dspark.hc_head", "dspark.base_logits", "dspark.logits", "dspark.confidence"}
    assert want <= set(rr.order) and want <= set(rn.order)
    for name in want:
        a, b = rn[name].double(), rr[name].double()
        assert float((a - b).norm() / b.norm()) < 1e-5, name     # FP32 rounding only (observed <= 7e-7)
    assert dn.tokens == dr.tokens


def test_default_plan_draft_runs_every_draft_class_on_the_backend_and_is_lossless(path) -> None:
    target = load_model(path, plan="default", backend="emulated")
    draft = load_dspark(target)
    fp4 = [c for c in DRAFT_PLAN_CLASSES if target.plan[c] == "fp4"]
    assert set(fp4) == {"draft_main_proj", "draft_attn_q", "draft_attn_kv", "draft_attn_o", "draft_shared_expert",
                        "draft_routed_experts"}
    res = draft.generate(PROMPT, 16)
    ran = {comp for comp, _, op in target.kernel_log if op != "quantize_activation"}
    assert set(fp4) <= ran
    target.assert_kernels_ran()
    logits, st = target.prefill(PROMPT)
    plain = [int(torch.argmax(logits[-1]))]
    while len(plain) < 16:
        plain.append(int(torch.argmax(target.decode_step(st, plain[-1]))))
    assert res.tokens == plain
    assert 1 <= res.acceptance_length <= draft.gamma + 1


def test_a_draft_class_moves_the_draft_and_never_the_target(path) -> None:
    base = load_model(path, plan="default", backend="emulated")
    flipped = load_model(path, plan={"base": "default", "components": {"draft_markov_head": "fp4"}}, backend="emulated")
    assert torch.equal(base.prefill(PROMPT)[0], flipped.prefill(PROMPT)[0])
    d0, _ = _draft_probes(load_dspark(base), base.new_state(PROMPT))
    d1, _ = _draft_probes(load_dspark(flipped), flipped.new_state(PROMPT), forced=d0.tokens)
    assert torch.equal(d0.base_logits, d1.base_logits)           # before the Markov head: same
    assert not torch.equal(d0.logits, d1.logits)                 # after it: the FP4 W2
    assert any(r.component == "draft_markov_head" and r.target == "fp4" for r in load_dspark(flipped).conversion_records)


def test_a_checkpoint_without_dspark_is_one_clear_error() -> None:
    target = load_model(str(resolve_preset("tiny", flavor="nvidia-nvfp4", seed=0)), backend="emulated")
    with pytest.raises(ValueError, match="expected a checkpoint with dspark_"):
        load_dspark(target)
