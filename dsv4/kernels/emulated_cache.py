"""Decoded weight operands of the emulated backend, kept while their packed tensors live unchanged.

The emulated GEMM dequantizes both operands on every call. For a weight that is the same bytes
call after call: at tiny width the decode (nibble unpack, two table gathers, a product, ~15 small
kernels) costs more than the matmul, and on a GPU each small kernel is a launch. A hit returns the
identical FP32 tensor the decode would build, so results do not change.

An entry is valid while both source tensors are alive (weak references, evicted when either is
freed, so an address reused by the allocator never hits) and unmodified (their version counters:
an in-place patch, e.g. a bug-zoo fault, misses). The cache holds at most ``DSV4_EMULATED_DECODE_CACHE_MIB``
(default 512) MiB per process; at real width most weights do not fit and are decoded per call as before.
"""
from __future__ import annotations

import os
import weakref
from typing import Callable, Hashable

import torch

DEFAULT_MIB = 512


def _budget() -> int:
    raw = os.environ.get("DSV4_EMULATED_DECODE_CACHE_MIB", str(DEFAULT_MIB))
    try:
        mib = int(raw)
    except ValueError:
        raise ValueError(f"DSV4_EMULATED_DECODE_CACHE_MIB: expected a whole number of MiB, found {raw!r}") from None
    if mib < 0:
        raise ValueError(f"DSV4_EMULATED_DECODE_CACHE_MIB: expected >= 0, found {mib}")
    return mib << 20


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:   # inference tensors track no version: never cached
        return None


class DecodeCache:
    def __init__(self, budget_bytes: int | None = None):
        self.budget = _budget() if budget_bytes is None else budget_bytes
        self.used = 0
        self.hits = 0
        self.misses = 0
        self._entries: dict[tuple, tuple] = {}

    def get(self, packed: torch.Tensor, scales: torch.Tensor, extra: Hashable,
            build: Callable[[], torch.Tensor]) -> torch.Tensor:
        key = (id(packed), id(scales), extra)
        versions = (_version(packed), _version(scales))
        ent = self._entries.get(key)
        if ent is not None:
            pref, sref, vers, value, _ = ent
            if pref() is packed and sref() is scales and vers == versions and None not in versions:
                self.hits += 1
                return value
            self._evict(key)
        self.misses += 1
        value = build()
        size = value.numel() * value.element_size()
        if None not in versions and self.used + size <= self.budget:
            drop = lambda _ref, k=key, c=weakref.ref(self): c() is not None and c()._evict(k)  # noqa: E731
            self._entries[key] = (weakref.ref(packed, drop), weakref.ref(scales, drop), versions, value, size)
            self.used += size
        return value

    def _evict(self, key: tuple) -> None:
        # runs from weak-reference callbacks, also at interpreter exit: plain Python only, no tensor call
        ent = self._entries.pop(key, None)
        if ent is not None:
            self.used -= ent[4]

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0
