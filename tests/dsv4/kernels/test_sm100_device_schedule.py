"""The sm_100a grouped kernel's work schedule built on the device (``sm100/device_schedule.py``): the
host schedule's rows in its order, then rows that store nothing, in a length fixed by M and E alone,
and built without reading the offsets on the host (captured in a CUDA graph, replayed with another
routing, on a GPU)."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.kernels.cutedsl.sm100.device_schedule import device_grouped_schedule, max_work
from dsv4.kernels.cutedsl.sm100.layout import TILE_M, grouped_schedule


@st.composite
def routings(draw):
    experts = draw(st.integers(1, 40))
    counts = draw(st.lists(st.sampled_from([0, 0, 1, 3, 17, 127, 128, 129, 300]), min_size=experts,
                           max_size=experts))
    if sum(counts) == 0:
        counts[draw(st.integers(0, experts - 1))] = draw(st.integers(1, 400))
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    return offsets


def owners(sched: torch.Tensor, m: int) -> torch.Tensor:
    """Which expert each row is stored by, as the kernel's epilogue stores (rows lo <= r < hi of the tile)."""
    owner = torch.full((m,), -1)
    for e, mt, lo, hi in sched.tolist():
        rows = torch.arange(mt * TILE_M, (mt + 1) * TILE_M)
        rows = rows[(rows >= lo) & (rows < hi)]
        assert (owner[rows] == -1).all(), "a row stored twice"
        owner[rows] = e
    return owner


@settings(max_examples=150, deadline=None)
@given(routings())
def test_device_schedule_is_the_host_schedule_then_rows_that_store_nothing(offsets) -> None:
    m, experts = offsets[-1], len(offsets) - 1
    host = grouped_schedule(offsets)
    dev = device_grouped_schedule(torch.tensor(offsets, dtype=torch.int32), m)
    assert dev.dtype == torch.int32 and tuple(dev.shape) == (max_work(m, experts), 4)
    assert host.shape[0] <= dev.shape[0] == math.ceil(m / TILE_M) + min(experts, m) - 1
    assert torch.equal(dev[: host.shape[0]], host)
    assert (dev[host.shape[0]:] == 0).all()
    want = torch.repeat_interleave(torch.arange(experts), torch.tensor(offsets).diff())
    assert torch.equal(owners(dev, m), want), "every row stored once, by its own expert"


def test_the_bound_is_reached_when_every_expert_holds_one_tile_or_more() -> None:
    # 3 experts, each crossing a tile boundary: tiles 0-1, 1-2, 2-3 -> 6 rows of work, ceil(400/128) + 3 - 1 = 6
    offsets = [0, 130, 260, 400]
    dev = device_grouped_schedule(torch.tensor(offsets), 400)
    assert dev.shape[0] == 6 and not (dev == 0).all(dim=1).any()
    assert device_grouped_schedule(torch.tensor([0, 0, 0]), 0).shape == (0, 4)
    assert max_work(6, 384) == 6     # a decode step of 6 routed rows: 6 slots, never 384


@pytest.mark.gpu
def test_device_schedule_replays_in_a_cuda_graph_with_another_routing() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none is present on this machine")
    first, second = [0, 5, 5, 140, 300], [0, 0, 200, 201, 300]
    offsets = torch.tensor(first, dtype=torch.int32, device="cuda")
    device_grouped_schedule(offsets, 300)           # warm-up outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                       # a host read of the offsets would fail the capture
        sched = device_grouped_schedule(offsets, 300)
    for routing in (first, second):
        offsets.copy_(torch.tensor(routing, dtype=torch.int32))
        g.replay()
        torch.cuda.synchronize()
        host = grouped_schedule(routing)
        assert torch.equal(sched[: host.shape[0]].cpu(), host) and (sched[host.shape[0]:] == 0).all()
