"""A native model larger than its GPU: its layers are built from the checkpoint when a forward reaches
them, and only those that fit a byte budget stay resident.

``load_streamed_model`` returns an ordinary :class:`~dsv4.model.NativeModel` (same surface, same
records) whose ``blocks`` is a :class:`StreamedBlocks`: ``blocks[i]`` builds layer ``i`` on first use.
Layers are kept in the order they are first built while their weights fit ``resident_bytes``; every
later layer is *transient*: built, used, and dropped when the next transient one is built (at most one
is held, so the peak is the resident set + one layer). A prompt-by-prompt harness reads layers in the
same order every forward, and for such a cyclic scan keeping the first layers that fit is the best a
fixed budget can do (least-recently-used would evict each layer just before it is needed again).

What a transient layer loses when it is dropped is brought back when it is rebuilt: activation scales
frozen at its first call (``act_scale="frozen"``) are kept by module name, and conversion records are
kept from the first build only. A streamed model cannot be captured in a CUDA graph (a replay would read
a dropped layer's freed weights): ``dsv4.decode.graphs`` refuses it.
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

if TYPE_CHECKING:
    from .layers.block import Block

HOST_SHARE = 0.5              # on the CPU, default budget: this share of the host's available memory
GPU_RESERVE_SHARE = 0.2       # on a GPU, default budget: free memory less this share of the card (activations,
GPU_RESERVE_MIN = 8 * 2**30   # probes, the transient layer), at least this many bytes


def block_bytes(block: Any) -> int:
    """Bytes of the tensors a built layer holds (each storage once)."""
    from .model import layer_objects

    seen: set[tuple[str, int]] = set()
    total = 0

    def add(t: torch.Tensor) -> None:
        nonlocal total
        s = t.untyped_storage()
        key = (str(t.device), s.data_ptr())
        if key not in seen:
            seen.add(key)
            total += s.nbytes()

    for obj in layer_objects(block):
        for v in vars(obj).values():
            if isinstance(v, torch.Tensor):
                add(v)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    if isinstance(x, torch.Tensor):
                        add(x)
    return total


def is_streamed(model: Any) -> bool:
    """Whether ``model``'s layers are streamed (built on use, some dropped: nothing may keep their tensors)."""
    return isinstance(getattr(model, "blocks", None), StreamedBlocks)


def _check_budget(resident_bytes: Any) -> None:
    if isinstance(resident_bytes, bool) or not isinstance(resident_bytes, int) or resident_bytes < 0:
        raise ValueError(f"resident_bytes: expected an int >= 0, found {resident_bytes!r}")


def default_resident_bytes(device: str) -> int:
    """The default budget for resident layers on ``device`` (see the constants above)."""
    d = torch.device(device)
    if d.type == "cuda":
        free, total = torch.cuda.mem_get_info(d.index if d.index is not None else torch.cuda.current_device())
        return max(0, int(free - max(GPU_RESERVE_MIN, GPU_RESERVE_SHARE * total)))
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        avail = 0
    return int(HOST_SHARE * avail)


class StreamedBlocks(Sequence):  # type: ignore[type-arg]
    """``model.blocks`` of a streamed model (see the module docstring). ``build(i)`` makes layer ``i``;
    ``stats()`` says what was built, kept and read."""

    def __init__(self, build: Callable[[int], Block], n_layers: int, resident_bytes: int) -> None:
        _check_budget(resident_bytes)
        self._build, self._n, self.resident_bytes = build, n_layers, resident_bytes
        self._resident: dict[int, Block] = {}
        self._resident_used = 0
        self._transient: tuple[int, Block] | None = None
        self._frozen: dict[str, torch.Tensor] = {}      # module name -> activation scale frozen at first call
        self.builds = 0
        self.bytes_built = 0
        self.build_seconds = 0.0

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[Block]:
        for i in range(self._n):
            yield self[i]

    def __getitem__(self, i: Any) -> Block:   # type: ignore[override]
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"streamed blocks: expected a layer index, found {i!r}")
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"layer {i}: the model has layers 0..{self._n - 1}")
        if i in self._resident:
            return self._resident[i]
        if self._transient is not None and self._transient[0] == i:
            return self._transient[1]
        self._drop_transient()           # before the build: the peak is the resident set + one layer
        t0 = time.perf_counter()
        block = self._build(i)
        self.build_seconds += time.perf_counter() - t0
        nbytes = block_bytes(block)
        self.builds += 1
        self.bytes_built += nbytes
        self._restore_frozen(block)
        if self._resident_used + nbytes <= self.resident_bytes:
            self._resident[i] = block
            self._resident_used += nbytes
        else:
            self._transient = (i, block)
        return block

    def stats(self) -> dict[str, Any]:
        return {"layers": self._n, "resident_layers": sorted(self._resident), "resident_bytes": self._resident_used,
                "resident_budget": self.resident_bytes, "builds": self.builds, "bytes_built": self.bytes_built,
                "build_seconds": round(self.build_seconds, 3)}

    def _drop_transient(self) -> None:
        if self._transient is None:
            return
        for obj in _linears(self._transient[1]):
            if getattr(obj, "frozen_scale", None) is not None:
                self._frozen[obj.name] = obj.frozen_scale
        self._transient = None

    def _restore_frozen(self, block: Block) -> None:
        if not self._frozen:
            return
        for obj in _linears(block):
            if hasattr(obj, "frozen_scale") and obj.name in self._frozen:
                obj.frozen_scale = self._frozen[obj.name]

    def forget_frozen(self) -> None:
        """Drop the kept frozen scales (a backend switch starts them over, as for resident layers)."""
        self._frozen.clear()


def _linears(block: Any) -> list[Any]:
    from .model import layer_objects

    return [o for o in layer_objects(block) if hasattr(o, "frozen_scale") and hasattr(o, "name")]


def load_streamed_model(path_or_preset: str | Path, *, plan: Any = "default", backend: str = "auto",
                        device: str = "cpu", act_scale: str = "static", resident_bytes: int | None = None) -> Any:
    """The native model of ``load_model`` on one device, its layers streamed (module docstring).
    ``resident_bytes``: the budget for layers kept between forwards (default: ``default_resident_bytes``
    once the embedding and the head are built; 0 re-reads every layer on every forward)."""
    from .checkpoint.reader import open_checkpoint
    from .model import _ACT_DTYPES, ACT_DTYPE, _Builder, load_model, resolve_checkpoint, set_act_dtype

    if resident_bytes is not None:
        _check_budget(resident_bytes)       # before anything is built
    model = load_model(path_or_preset, plan=plan, backend=backend, device=device, act_scale=act_scale,
                       only=["embed", "head"])
    reader = open_checkpoint(resolve_checkpoint(path_or_preset))
    builder = _Builder(reader, model.plan, model.device_map, model.dispatchers, act_scale)
    act = _ACT_DTYPES[model.plan.act_dtype]
    first_built: set[int] = set()

    def build(i: int) -> Block:
        start = len(builder.records)
        block = builder.block(i)
        if act != ACT_DTYPE:
            set_act_dtype(block, act)
        new = builder.records[start:]
        del builder.records[start:]
        if i not in first_built:        # conversion records: each layer's first build, in build order
            first_built.add(i)
            model.conversion_records.extend(new)
        return block

    budget = default_resident_bytes(device) if resident_bytes is None else resident_bytes
    model.blocks = StreamedBlocks(build, reader.config.num_hidden_layers, budget)
    model.only = None
    return model


__all__ = ["StreamedBlocks", "block_bytes", "default_resident_bytes", "is_streamed", "load_streamed_model"]
