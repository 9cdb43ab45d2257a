"""The draft's training (reference.training.draft_loop) runs the reference's own draft code: the
autograd path equals the no-grad draft call bit for bit, gradients reach every trained draft weight
and no target weight, and the held-out teacher-forced acceptance length lies in [1, γ + 1]."""
from __future__ import annotations

import pytest
import torch

import reference
from dsv4.checkpoint.synth import resolve_preset
from reference.dspark import DSparkReference
from reference.training.draft_loop import DraftSettings, DraftWeights, draft_rows, target_pass, teacher_forced_tau


@pytest.fixture(scope="module")
def ds() -> DSparkReference:
    model = reference.load_model(str(resolve_preset("tiny-dspark", "official-dspark", 0)), dtype=torch.float32)
    model.store = DraftWeights(model.store, model.config, seed=1)
    return DSparkReference(model)


def test_training_path_is_the_reference_draft_with_gradients(ds) -> None:
    ids = torch.randint(0, ds.c.vocab_size, (60,), generator=torch.Generator().manual_seed(0))
    mh, labels = target_pass(ds, ids)
    p = 30
    logits, conf, tgt = draft_rows(ds, ids, mh, labels, p)
    state = ds.new_state()
    state.pos = p - ds.c.sliding_window
    ds.commit(state, mh[state.pos:p])
    d = ds.draft(state, int(ids[p]), forced=tgt.tolist())          # the public, no-grad call
    assert torch.equal(d.logits, logits.detach()) and torch.equal(d.confidence, conf.detach())
    (torch.nn.functional.cross_entropy(logits, tgt) + conf.sum()).backward()
    weights = ds.model.store
    trained = {n for n, t in weights.parameters() if t.requires_grad}
    got = {n for n, t in weights.parameters() if t.grad is not None and bool(t.grad.abs().sum() > 0)}
    assert got <= trained and all(n.startswith("mtp.") for n in got)
    # everything but the experts this block's rows were not routed to
    assert all(".ffn.experts." in n for n in trained - got)
    assert all(any(n.startswith(f"mtp.{s}.ffn.experts.") for n in got) for s in range(ds.stages))
    assert not any(n.endswith("ffn.gate.bias") for n in trained)   # selection only: no gradient (as the trunk's)


def test_teacher_forced_tau_is_an_acceptance_length(ds) -> None:
    stream = torch.randint(0, ds.c.vocab_size, (400,), generator=torch.Generator().manual_seed(1))
    s = DraftSettings(seq_len=64, anchors=4, eval_windows=2)
    tau = teacher_forced_tau(ds, stream, s, bos=0)
    assert 1.0 <= tau <= ds.gamma + 1
