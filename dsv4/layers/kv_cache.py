"""KV storage formats (the ``kv_cache`` plan class) and the per-layer decode caches.

Storage (spec §5 step 2, §6 step 7, §8, §12): the window KV (after kv_norm + RoPE) and the
compressed KV entries keep dims [0, nope) in FP8 E4M3 with one UE8M0 power-of-two scale per 64
(``fp8``; the VL/SG packed cache layout, which the official fake quantization matches) or in BF16
(``bf16``); the rope dims always stay BF16. Attention reads what was stored, in prefill and decode
alike, so both see the same numbers.

Caches per layer: a ring of ``sliding_window`` slots (position p lives in slot p mod W, §8), the
compressed entries, the indexer keys, and the compressors' partial-block state (§6 "Decode").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..numerics import fp8_act_dequantize, fp8_act_quantize

KV_FP8_BLOCK = 64


@dataclass
class StoredKV:
    """Encoded KV rows: named parts sharing the leading (row) dimension."""

    parts: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(next(iter(self.parts.values())).shape[0])

    def cat(self, other: "StoredKV") -> "StoredKV":
        return StoredKV({k: torch.cat((v, other.parts[k])) for k, v in self.parts.items()})

    def take(self, index: "slice | torch.Tensor") -> "StoredKV":
        return StoredKV({k: v[index] for k, v in self.parts.items()})

    def empty_like(self, rows: int) -> "StoredKV":
        return StoredKV({k: v.new_zeros((rows,) + tuple(v.shape[1:])) for k, v in self.parts.items()})


class KVStorage:
    fmt: ClassVar[str] = ""

    def __init__(self, head_dim: int, rope_dim: int) -> None:
        self.head_dim, self.rope_dim = head_dim, rope_dim
        self.nope = head_dim - rope_dim

    def encode(self, kv: torch.Tensor) -> StoredKV:
        raise NotImplementedError

    def decode(self, s: StoredKV) -> torch.Tensor:
        raise NotImplementedError

    def roundtrip(self, kv: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(kv))


class Bf16KVStorage(KVStorage):
    fmt = "bf16"

    def encode(self, kv: torch.Tensor) -> StoredKV:
        return StoredKV({"kv": kv.to(torch.bfloat16)})

    def decode(self, s: StoredKV) -> torch.Tensor:
        return s.parts["kv"]


class Fp32KVStorage(KVStorage):
    """No rounding at all (plan ``all-fp32``)."""

    fmt = "fp32"

    def encode(self, kv: torch.Tensor) -> StoredKV:
        return StoredKV({"kv": kv.to(torch.float32)})

    def decode(self, s: StoredKV) -> torch.Tensor:
        return s.parts["kv"]


class Fp8KVStorage(KVStorage):
    """dims [0, nope): E4M3 + UE8M0 per 64 (official act_quant, block 64); rope dims BF16."""

    fmt = "fp8"

    def __init__(self, head_dim: int, rope_dim: int) -> None:
        super().__init__(head_dim, rope_dim)
        if self.nope % KV_FP8_BLOCK:
            raise ValueError(f"kv_cache fp8: expected head_dim - rope_dim a multiple of {KV_FP8_BLOCK}, "
                             f"found {self.nope}")

    def encode(self, kv: torch.Tensor) -> StoredKV:
        q, s = fp8_act_quantize(kv[..., :self.nope], KV_FP8_BLOCK)
        return StoredKV({"nope": q, "scales": s, "rope": kv[..., self.nope:].to(torch.bfloat16)})

    def decode(self, s: StoredKV) -> torch.Tensor:
        nope = fp8_act_dequantize(s.parts["nope"], s.parts["scales"]).to(torch.bfloat16)  # exact in BF16
        return torch.cat((nope, s.parts["rope"]), dim=-1)


KV_STORAGES: dict[str, type[KVStorage]] = {"fp8": Fp8KVStorage, "bf16": Bf16KVStorage, "fp32": Fp32KVStorage}


class WindowCache:
    """Ring buffer of ``size`` rows; position p lives in slot ``p % size``. The trunk's attention stores
    its rows decoded (each encoded and decoded once, so the numbers are the stored format's) and does
    not decode the whole window again at every step; the DSpark rings store them encoded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.slots: StoredKV | None = None
        self.length = 0   # positions written so far (the next position)

    def write(self, start: int, rows: StoredKV) -> None:
        if start != self.length:
            raise RuntimeError(f"window cache: expected rows starting at position {self.length}, found {start}")
        n = len(rows)
        if self.slots is None:
            self.slots = rows.empty_like(self.size)
        keep = min(n, self.size)   # older rows of a long chunk would be overwritten anyway
        # made on the rows' device: a CPU arange copied there is a synchronizing copy every decode step
        slot = torch.arange(start + n - keep, start + n, device=next(iter(rows.parts.values())).device) % self.size
        for k, v in self.slots.parts.items():
            v[slot] = rows.parts[k][n - keep:]
        self.length = start + n

    def recent(self, count: int) -> StoredKV | None:
        """The last ``count`` positions (``count <= size``), oldest first; None when count is 0."""
        count = min(count, self.length, self.size)
        if count == 0 or self.slots is None:
            return None
        slot = torch.arange(self.length - count, self.length, device=next(iter(self.slots.parts.values())).device) % self.size
        return self.slots.take(slot)


@dataclass
class CompressorState:
    """Raw projections not yet pooled (FP32): ``prev_*`` the last complete block (CSA overlap only),
    ``tail_*`` the tokens of the open block. Gate logits are kept WITHOUT the ape (it is added in
    ``Compressor.pool``, indexed by the position inside the block)."""

    prev_kv: torch.Tensor | None = None
    prev_gate: torch.Tensor | None = None
    tail_kv: torch.Tensor | None = None
    tail_gate: torch.Tensor | None = None
    entries: int = 0   # entries emitted so far (= index of the next entry)


@dataclass
class LayerCache:
    """Everything layer i keeps between calls. ``length``: positions processed by this layer."""

    window: WindowCache
    length: int = 0
    compressed: StoredKV | None = None          # attention compressed entries (encoded)
    compressed_decoded: torch.Tensor | None = None   # the same, decoded (what attention reads)
    index_keys: torch.Tensor | None = None      # indexer keys, after Hadamard / fake quant when planned
    compressor: CompressorState = field(default_factory=CompressorState)
    index_compressor: CompressorState = field(default_factory=CompressorState)
