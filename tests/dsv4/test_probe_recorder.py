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
        big = torch.ones(80 << 20, device="cuda")   # 320 MiB > a slab: copied synchronously instead
        probes.emit("big", big)
    first, second, strided = rec["x"]
    assert not rec._pending and first.is_pinned() and not first.is_cuda
    assert torch.equal(first, want) and torch.equal(second, want * 2) and torch.equal(strided, (want * 2)[:, ::2])
    (big_host,) = rec["big"]
    assert not big_host.is_pinned() and bool((big_host == 1).all())
    assert rec._slabs.reserved < 2 * rec._slabs.used       # slabs, not a power of two per probe


def test_slabs_are_powers_of_two_and_tensors_are_aligned_views_of_them():
    from dsv4 import pinned_slabs
    from dsv4.pinned_slabs import ALIGN, MAX_SLAB, MIN_SLAB, PinnedSlabs

    made: list[int] = []

    def alloc(n: int) -> torch.Tensor:        # pageable stand-in for pinned memory (no GPU here)
        made.append(n)
        return torch.empty(n, dtype=torch.uint8)

    s = PinnedSlabs(alloc)
    a = s.empty((3, 5), torch.float32)
    b = s.empty((7,), torch.bfloat16)
    c = s.empty((), torch.int64)
    assert made == [MIN_SLAB]                                 # small tensors share the first slab
    for t, shape in ((a, (3, 5)), (b, (7,)), (c, ())):
        assert tuple(t.shape) == shape and t.is_contiguous() and t.data_ptr() % ALIGN == 0
    a.fill_(1.5), b.fill_(2.0), c.fill_(7)
    assert float(a.sum()) == 22.5 and float(b.sum()) == 14.0 and int(c) == 7   # no overlap
    big = s.empty((3 * MIN_SLAB // 4,), torch.float32)        # 3 MiB: a new slab, 4 MiB
    assert made == [MIN_SLAB, 4 * MIN_SLAB] and big.numel() == 3 * MIN_SLAB // 4
    s.empty((1,), torch.uint8)                                # fits the 4 MiB slab's tail
    assert made == [MIN_SLAB, 4 * MIN_SLAB]
    s.empty((MIN_SLAB,), torch.uint8)                         # does not: the next is twice the last
    assert made[-1] == 8 * MIN_SLAB and all(n & (n - 1) == 0 for n in made)
    assert s.empty((MAX_SLAB + 1,), torch.uint8) is None      # too big for a slab: the caller copies
    assert s.reserved == sum(made) and s.used == 60 + 14 + 8 + 3 * MIN_SLAB + 1 + MIN_SLAB
    assert pinned_slabs.MAX_SLAB & (pinned_slabs.MAX_SLAB - 1) == 0
