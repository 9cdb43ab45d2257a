"""``ProbeRecorder``: what it keeps, and its host copies of CUDA tensors (pinned, asynchronous) hold
the value at emission, complete once the recorder exits (the GPU half is ``gpu``-marked)."""
from __future__ import annotations

import pytest
import torch

from dsv4 import probes


def test_to_cpu_keeps_cpu_tensors_and_the_include_filter():
    x = torch.arange(6.0)
    with probes.ProbeRecorder(include=r"^a\.", to_cpu=True) as rec:
        probes.emit("a.x", x)
        probes.emit("b.x", x)
    assert list(rec) == ["a.x"] and torch.equal(rec["a.x"], x) and not rec._pending


def test_keep_all_appends_every_emission():
    with probes.ProbeRecorder(keep="all") as rec:
        for i in range(3):
            probes.emit("s", torch.tensor([i]))
    assert [int(v) for v in rec["s"]] == [0, 1, 2]


@pytest.mark.gpu
def test_cuda_probes_land_in_pinned_memory_with_their_value_at_emission():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    x = torch.randn(4096, 1024, device="cuda")
    want = x.cpu()
    with probes.ProbeRecorder(to_cpu=True, keep="all") as rec:
        probes.emit("x", x)
        x.mul_(2.0)                    # after the emission, on the same stream: not in the probe
        probes.emit("x", x)
        probes.emit("x", x[:, ::2])    # a strided view
    first, second, strided = rec["x"]
    assert not rec._pending and first.is_pinned() and not first.is_cuda
    assert torch.equal(first, want) and torch.equal(second, want * 2) and torch.equal(strided, (want * 2)[:, ::2])
