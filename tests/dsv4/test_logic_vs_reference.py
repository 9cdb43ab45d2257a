"""The logic check (design.md): the native model under ``all-bf16`` against the BF16 reference on the
tiny checkpoint. No quantization on either side, so any gap is a bug: per-position logits cosine
>= 0.999, per-layer cosine of ``layers.i.out`` >= 0.999, identical top-1, identical selections.
On a disagreement the spec decides; neither side is adapted to the other."""
from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.probes import ProbeRecorder

reference = pytest.importorskip("reference")
T = 40
IDS = torch.randint(0, 512, (T,), generator=torch.Generator().manual_seed(0))


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double().flatten(1), b.double().flatten(1), dim=-1)


@pytest.fixture(scope="module")
def runs() -> tuple[ProbeRecorder, ProbeRecorder]:
    nat = dsv4.load_model("tiny", plan="all-bf16")
    ref = reference.load_model("tiny", profile="bf16")
    with ProbeRecorder() as a:
        nat(IDS)
    with ProbeRecorder() as b:
        ref(IDS)
    return a, b


# A BF16 ulp of a logit of magnitude 8..16 is 0.0625: a reference top-2 margin below that is a
# near-tie both sides may order either way (parity-methods.md §9), not a logic failure.
NEAR_TIE = 0.0625


def test_logits_per_position_and_top1(runs):
    a, b = runs
    assert _cos(a["logits"], b["logits"]).min() >= 0.999
    top2 = b["logits"].topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) >= NEAR_TIE
    assert decided.float().mean() >= 0.75           # the exclusion cannot hide the comparison
    agree = a["logits"].argmax(-1) == b["logits"].argmax(-1)
    assert bool(agree[decided].all()), agree.logical_not().nonzero().flatten().tolist()


def test_every_layer_output(runs):
    a, b = runs
    for i in range(4):
        c = _cos(a[f"layers.{i}.out"], b[f"layers.{i}.out"])
        assert c.min() >= 0.999, (i, float(c.min()))


def test_every_shared_probe_and_selection(runs):
    a, b = runs
    assert a.order == b.order
    for name in a.order:
        x, y = a[name], b[name]
        assert x.shape == y.shape, name
        if name.endswith(("topk", "topk_ids")):
            assert torch.equal(x, y), name
        elif x.numel():
            fin = torch.isfinite(x)
            assert torch.equal(fin, torch.isfinite(y)), name
            assert _cos(x.where(fin, 0).reshape(1, -1), y.where(fin, 0).reshape(1, -1)).item() >= 0.999, name
