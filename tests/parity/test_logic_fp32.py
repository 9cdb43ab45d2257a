"""The FP32 logic column: reference (bf16 profile) in FP32 and native ``all-fp32`` agree to FP32
summation order at every probe, propagated as well as isolated, so a logic fault has no BF16 noise or
near-tie flip to hide behind."""
from __future__ import annotations

import torch

from dsv4.model import load_model
from parity.metrics import compare_tensors
from parity.runner import run_isolated, run_propagated
from parity.threeway import LOGIC_PLAN, LOGIC_REF_DTYPE
from reference.model import load_model as load_reference


def test_fp32_pair_agrees_to_summation_order_at_every_probe(tiny) -> None:
    ids = torch.arange(1, 41) % tiny.config.vocab_size
    ref = run_propagated(load_reference(str(tiny.path), profile="bf16", dtype=LOGIC_REF_DTYPE), ids)
    native = load_model(str(tiny.path), plan=LOGIC_PLAN, backend="emulated")
    assert native.act_dtype == torch.float32 and native.describe()["dtype"] == "float32"
    prop = run_propagated(native, ids)
    iso, _ = run_isolated(native, ids, ref, tiny.config.num_hidden_layers)
    float_probes = [k for k, v in ref.probes.items() if v.is_floating_point()]
    assert len(float_probes) > 50
    for test in (prop.probes, iso):
        for k in float_probes:
            assert test[k].dtype == torch.float32, k
            c = compare_tensors(ref.probes[k], test[k])
            assert c.rel_diff < 1e-11 and c.nonfinite_mismatch == 0, (k, c.rel_diff)
    for k in ("layers.0.ffn.router.topk_ids", "layers.1.attn.indexer.topk"):
        assert torch.equal(ref.probes[k], prop.probes[k])


def test_default_plan_still_computes_in_bf16(tiny) -> None:
    native = load_model(str(tiny.path), plan="default", backend="emulated")
    out = run_propagated(native, torch.arange(1, 9))
    assert native.act_dtype == torch.bfloat16 and out.probes["layers.0.out"].dtype == torch.bfloat16


def test_precision_faults_do_not_apply_to_the_fp32_logic_model(tiny) -> None:
    """An NVFP4 precision mistake has no meaning in the FP32 logic model: a clear FaultTargetError (the
    attribution study records the plan as not applicable), not a kernel-contract crash."""
    import pytest

    from parity.bugzoo import FaultTargetError, get_fault

    native = load_model(str(tiny.path), plan=LOGIC_PLAN, backend="emulated")
    for name in ("lm_head_fp4", "router_gate_fp4"):
        with pytest.raises(FaultTargetError, match="fp32 in plan 'all-fp32'"):
            with get_fault(name)(native):
                pass
