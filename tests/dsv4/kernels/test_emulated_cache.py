"""The emulated backend's decoded-weight cache: a hit is the same decode, a changed or freed source misses."""
import gc

import torch

from dsv4.kernels.emulated_cache import DecodeCache


def _pair():
    return torch.randint(0, 255, (8, 16), dtype=torch.uint8), torch.rand(8, 2)


def test_hit_returns_the_first_decode_and_counts():
    c = DecodeCache(1 << 20)
    p, s = _pair()
    calls = []
    build = lambda: calls.append(1) or p.float() * 2  # noqa: E731
    first = c.get(p, s, "k", build)
    assert c.get(p, s, "k", build) is first and len(calls) == 1 and (c.hits, c.misses) == (1, 1)


def test_in_place_change_of_either_source_misses():
    c = DecodeCache(1 << 20)
    p, s = _pair()
    a = c.get(p, s, "k", lambda: p.float())
    p[0, 0] ^= 1                                    # a bug-zoo style in-place patch
    b = c.get(p, s, "k", lambda: p.float())
    assert b is not a and torch.equal(b, p.float())
    s.mul_(2)
    assert c.get(p, s, "k", lambda: s.clone()) is not b


def test_freed_source_is_evicted_and_budget_is_respected():
    c = DecodeCache(8 * 16 * 4)                     # room for exactly one float32 [8, 16]
    p, s = _pair()
    c.get(p, s, "k", lambda: p.float())
    assert c.used == 8 * 16 * 4
    q, t = _pair()
    c.get(q, t, "k", lambda: q.float())             # over budget: decoded, not kept
    assert c.used == 8 * 16 * 4 and len(c._entries) == 1
    del p
    gc.collect()
    assert c.used == 0 and not c._entries


def test_zero_budget_keeps_nothing(monkeypatch):
    monkeypatch.setenv("DSV4_EMULATED_DECODE_CACHE_MIB", "0")
    c = DecodeCache()
    p, s = _pair()
    c.get(p, s, "k", lambda: p.float())
    assert c.used == 0 and not c._entries


def test_bad_budget_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("DSV4_EMULATED_DECODE_CACHE_MIB", "lots")
    try:
        DecodeCache()
    except ValueError as e:
        assert "expected a whole number of MiB" in str(e) and "'lots'" in str(e)
    else:
        raise AssertionError("no error")
