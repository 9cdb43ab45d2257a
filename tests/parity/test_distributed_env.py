"""parity.distributed outside a launch: one process is the identity; a malformed torchrun environment
is one bad-input error naming what was expected and found (before any process group is joined)."""
from __future__ import annotations

import pytest

from parity import distributed as D
from parity.errors import ParityInputError


def test_one_process_is_the_identity(monkeypatch) -> None:
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    world, device = D.init("cpu")
    assert (world.rank, world.size, world.active, world.main, device) == (0, 1, False, True, "cpu")
    assert D.shard(list("abcde")) == list("abcde") and D.all_gather(3) == [3] and D.broadcast("x") == "x"
    D.barrier()                                  # no group: returns at once


def test_round_robin_shares_cover_the_items_once() -> None:
    items = list(range(7))
    shares = [D.shard(items, D.World(r, 3)) for r in range(3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]


@pytest.mark.parametrize("env, found", [({"WORLD_SIZE": "two"}, "'two'"), ({"WORLD_SIZE": "2", "RANK": "2"},
                                                                          "RANK=2 WORLD_SIZE=2")])
def test_bad_launch_environment_is_bad_input(monkeypatch, env, found) -> None:
    monkeypatch.delenv("RANK", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ParityInputError, match="expected") as e:
        D.init("cpu")
    assert found in str(e.value)
