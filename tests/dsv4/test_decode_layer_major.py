"""A teacher-forced decode run layer by layer (dsv4.decode.layer_major) gives run_steps's logits and
probes, bit for bit, and a streamed model builds each of its layers once for the whole decode."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.decode.layer_major import run_steps_layer_major
from dsv4.decode.loop import DecodeInputError, run_steps
from dsv4.streamed import load_streamed_model

PROMPT = torch.arange(3, 20)
FORCED = [7, 11, 5, 300, 2, 9, 41, 13]


@pytest.mark.parametrize("act_scale", ["static", "frozen"])
def test_same_steps_as_the_step_by_step_decode(act_scale) -> None:
    want = list(run_steps(dsv4.load_model("tiny", backend="emulated", act_scale=act_scale), PROMPT, 8,
                          forced=FORCED, probe_steps=[2, 7]))
    for model in (dsv4.load_model("tiny", backend="emulated", act_scale=act_scale),
                  load_streamed_model("tiny", backend="emulated", act_scale=act_scale, resident_bytes=0)):
        got = list(run_steps_layer_major(model, PROMPT, 8, FORCED, probe_steps=[2, 7]))
        assert [(g.step, g.position, g.fed, g.target) for g in got] == [(w.step, w.position, w.fed, w.target)
                                                                        for w in want]
        assert all(torch.equal(g.logits, w.logits) for g, w in zip(got, want))
        for s in (2, 7):
            assert list(got[s].probes) == list(want[s].probes)           # the same probes, in emission order
            assert all(torch.equal(got[s].probes[k], want[s].probes[k]) for k in want[s].probes)
        assert got[1].probes is None
    assert model.blocks.stats()["builds"] == len(model.blocks)            # streamed: each layer once


def test_bad_requests_are_refused_before_any_compute() -> None:
    model = dsv4.load_model("tiny", backend="emulated")
    with pytest.raises(ValueError, match="expected forced tokens"):
        next(run_steps_layer_major(model, PROMPT, 4, None))
    with pytest.raises(DecodeInputError, match="forced tokens: expected at least 9"):
        next(run_steps_layer_major(model, PROMPT, 9, FORCED))
