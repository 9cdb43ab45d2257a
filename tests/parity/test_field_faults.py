"""Bugs from the field (parity/bugzoo/field_faults.py, docs/bugzoo.md): every fault cites a public
thread, checkpoint faults change exactly the tensor they name and load through the zoo's loader, the
kernel fault's scale packing is what it says, and the zoo catches and localizes the faults on both
built-in models with the clean row quiet."""
from __future__ import annotations

import re

import pytest
import torch

from parity.bugzoo import get_fault, list_faults
from parity.bugzoo.draft_zoo import DSPARK_FAULTS
from parity.bugzoo.field_faults import act_scale_mantissa_dropped, padded_width
from parity.bugzoo.runner import ZooSpec, load_holdout, run_zoo
from parity.rules import load_rules
from parity.source import resolve_checkpoint

FIELD = [f for f in list_faults() if f.module == "parity.bugzoo.field_faults"]
FIELD_DRAFT = [f for n, f in DSPARK_FAULTS.items() if n.startswith("field_")]
LINK = re.compile(r"https://github\.com/[\w.-]+/[\w.-]+/(pull|issues)/\d+")


def test_every_field_fault_cites_a_thread() -> None:
    assert len(FIELD) == 10 and len(FIELD_DRAFT) == 2
    for f in [*FIELD, *FIELD_DRAFT]:
        assert LINK.search(f.description), f.name


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).contiguous().view(torch.uint8)


def test_checkpoint_faults_change_only_their_tensor() -> None:
    from dsv4.checkpoint import open_checkpoint

    src = str(resolve_checkpoint("tiny-trained", 0).path)
    clean = open_checkpoint(src)
    for name, tensor in (("field_attn_sink_fp32_read_as_bf16", "layers.0.attn.attn_sink"),
                         ("field_router_bias_not_loaded", "layers.3.ffn.gate.bias")):
        fault = get_fault(name)
        copy = fault.checkpoint(src)
        assert fault.checkpoint(src) == copy           # written once per process
        bad = open_checkpoint(copy)
        changed = [n for n in clean.tensor_names()
                   if not torch.equal(_bytes(clean.get_tensor(n)), _bytes(bad.get_tensor(n)))]
        assert changed == [tensor], name
    sink = clean.get_tensor("layers.0.attn.attn_sink")
    misread = open_checkpoint(get_fault("field_attn_sink_fp32_read_as_bf16").checkpoint(src)).get_tensor(
        "layers.0.attn.attn_sink")
    halves = sink.view(torch.bfloat16).to(torch.float32)
    assert torch.equal(misread, halves[: sink.numel()])      # head h reads the h-th half-word


def test_act_scale_mantissa_dropped_keeps_exponents() -> None:
    b = torch.tensor([0x00, 0x07, 0x08, 0x0F, 0x3D, 0x40, 0x7E], dtype=torch.uint8)
    out = act_scale_mantissa_dropped(b)
    assert out.tolist() == [0x00, 0x07, 0x08, 0x08, 0x38, 0x40, 0x78]   # subnormals kept, mantissa cleared
    vals = out.view(torch.float8_e4m3fn).float()[2:]
    assert torch.all(torch.log2(vals) == torch.round(torch.log2(vals)))


def test_padded_width() -> None:
    assert padded_width(133) == 256 and padded_width(21) == 128 and padded_width(300, minimum=1) == 512


def _zoo(checkpoint: str, names: list[str]) -> list:
    src = resolve_checkpoint(checkpoint, 0)
    spec = ZooSpec(source=src, prompts=load_holdout(src), rules=load_rules(None, checkpoint))
    return run_zoo(spec, [get_fault(n) for n in names]).rows


def test_checkpoint_faults_caught_and_localized_on_trained() -> None:
    """The two loader bugs (through a faulty checkpoint copy) and one logic fault, ~10 s."""
    rows = _zoo("tiny-trained", ["field_attn_sink_fp32_read_as_bf16", "field_router_bias_not_loaded",
                                 "field_shared_expert_unclamped"])
    assert rows[0].fault is None and rows[0].passed, rows[0].columns_alarmed
    for r in rows[1:]:
        assert r.error is None, r.error
        assert r.caught and r.column_ok and r.localized, (r.name, r.columns_alarmed, r.first_divergence)


@pytest.mark.slow   # slow: every field fault on both built-in models (~30 s + ~60 s on a 2-core CPU)
@pytest.mark.parametrize("checkpoint", ["tiny-trained", "tiny"])
def test_every_field_fault_caught_and_localized(checkpoint: str) -> None:
    rows = _zoo(checkpoint, [f.name for f in FIELD])
    assert rows[0].passed, rows[0].columns_alarmed
    for r in rows[1:]:
        assert r.passed, (r.name, r.error, r.columns_alarmed, r.first_divergence)
