"""Streaming weight access: every weight is read through the lazy checkpoint reader when a layer
needs it, dequantized on the layer's device, and dropped with the layer's locals. Routed experts are
read one by one, only when a token selected them. ``cache=True`` memoizes dequantized tensors (small
models only: it holds a dequantized copy of the model)."""
from __future__ import annotations

import torch

from dsv4.checkpoint.formats import HASH, RAW
from dsv4.checkpoint.reader import CheckpointReader

from .dequant import dequantize


class WeightStore:
    """``get(name, layer, device)``: the logical tensor of one canonical weight.

    Dtypes: raw fp32 parameters stay fp32 and the hash table int64. Other weights are rounded to the
    model's weight dtype (bf16 storage, §12) unless ``fp32=True``: the weights OFF-M holds in fp32 for
    computation (norms, compressor wkv/wgate, gate, head; §2.3) keep the checkpoint's precision."""

    def __init__(self, reader: CheckpointReader, dtype: torch.dtype, cache: bool) -> None:
        self.reader = reader
        self.dtype = dtype
        self.cache = cache
        self._memo: dict[tuple[str, int | None, str, bool], torch.Tensor] = {}

    def get(self, name: str, layer: int | None, device: torch.device | str, fp32: bool = False) -> torch.Tensor:
        key = (name, layer, str(device), fp32)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        sw = self.reader.weight(name, layer)
        sw.tensors = {r: t.to(device) for r, t in sw.tensors.items()}
        w = dequantize(sw)
        if sw.fmt.kind not in (RAW, HASH):
            w = w if fp32 else w.to(self.dtype)
        if self.cache:
            self._memo[key] = w
        return w

    def release(self) -> None:
        """After a layer: drop the reader's open shard handles (their memory maps) unless caching."""
        if not self.cache:
            self.reader.close()


class LayerWeights:
    """The weights of one layer (or the globals, ``layer=None``) on one device, fetched on demand."""

    def __init__(self, store: WeightStore, layer: int | None, device: torch.device | str) -> None:
        self.store, self.layer, self.device = store, layer, device

    def __call__(self, name: str, fp32: bool = False) -> torch.Tensor:
        return self.store.get(name, self.layer, self.device, fp32)
