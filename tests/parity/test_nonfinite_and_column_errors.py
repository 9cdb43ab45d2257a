"""A non-finite value is its own finding, named where it is produced; a column that crashes is that
column's error while the others run and report."""
from __future__ import annotations

import torch

from dsv4.plan import PrecisionPlan
from parity.bugzoo.registry import block_of
from parity.records import to_frame
from parity.rules import load_rules
from parity.runner import DefaultLoaders
from parity.threeway import RunSpec, run_threeway
from parity.verdict import evaluate


class _Loaders(DefaultLoaders):
    """The floor column's native model (plan 'default') gets ``patch`` applied."""

    def __init__(self, patch):
        self.patch = patch

    def native(self, path, *, plan, backend, device, device_map):
        m = super().native(path, plan=plan, backend=backend, device=device, device_map=device_map)
        if plan.name == "default":
            self.patch(m)
        return m


def _inf_in_layer2_attention(model):
    attn = block_of(model, 2).attention
    original = attn.apply_rope

    def apply_rope(t, positions, *, inverse=False):
        out = original(t, positions, inverse=inverse)
        if inverse:
            out = out.clone()
            out.view(-1)[5] = float("inf")     # an overflow inside layer 2's attention
        return out

    attn.apply_rope = apply_rope


def test_nonfinite_is_named_at_its_source(tiny, chat_prompts):
    """An Inf inside layer 2's attention: the FP4 quantizer of the next GEMM then refuses NaN scales
    (the KernelContractError users saw); the column's error names where the Inf was produced."""
    spec = RunSpec(source=tiny, prompts=chat_prompts[:1], plan=PrecisionPlan.preset("default"),
                   columns=("logic", "floor"))
    result = run_threeway(spec, _Loaders(_inf_in_layer2_attention))
    assert result.columns["logic"].ran and not result.columns["floor"].ran
    reason = result.columns["floor"].reason
    assert "non-finite values first at layers.2.attn" in reason and "layer 2" in reason
    assert "KernelContractError" in reason
    verdict = evaluate(to_frame(result.records), load_rules())
    assert verdict.nonfinite_source("logic") is None and verdict.pair_passed("logic")


def test_nonfinite_in_the_compared_probes_is_its_own_finding():
    import pandas as pd

    base = {"pair": "floor", "prompt_id": "p", "layer": 2, "component": "attention", "metric": "nonfinite_mismatch"}
    df = pd.DataFrame([dict(base, compare_mode="propagated", probe="layers.3.attn.out", layer=3, value=4.0),
                       dict(base, compare_mode="propagated", probe="layers.2.attn.out", value=1.0),
                       dict(base, compare_mode="isolated", probe="layers.2.attn.out", value=1.0),
                       dict(base, compare_mode="isolated", probe="layers.1.attn.out", layer=1, value=0.0)])
    from parity.verdict import first_nonfinite

    found = first_nonfinite(df, "floor")
    assert found["isolated"].probe == "layers.2.attn.out" and found["propagated"].probe == "layers.2.attn.out"


def test_a_crashing_column_leaves_the_others(tiny, chat_prompts):
    def boom(model):
        def forward(*a, **k):
            raise RuntimeError("kernel exploded")
        block_of(model, 1).attention.apply_rope = forward

    spec = RunSpec(source=tiny, prompts=chat_prompts[:1], plan=PrecisionPlan.preset("default"),
                   columns=("logic", "floor"))
    result = run_threeway(spec, _Loaders(boom))
    assert result.columns["logic"].ran and not result.columns["floor"].ran
    assert "kernel exploded" in result.columns["floor"].reason
    assert set(result.column_errors) == {"floor"}
    assert any(r["pair"] == "logic" for r in result.records)     # the logic column's results are kept
    try:
        result.raise_errors()
    except RuntimeError as e:
        assert "kernel exploded" in str(e)
    else:
        raise AssertionError("raise_errors() should re-raise the floor column's error")
    assert torch.get_num_threads() >= 1
