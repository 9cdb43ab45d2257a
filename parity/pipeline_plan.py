"""Which rank of a layer pipeline holds which layers (parity/pipeline.py runs it).

A plan is contiguous blocks of layers in rank order: rank 0 holds the embedding and the first block,
the last rank the last block and the head, so the hidden stream only ever moves from rank r to r + 1.
Three spellings are accepted, every one checked the same way:

* ``None``: :func:`even_plan`, ``num_hidden_layers`` split evenly (the first ranks take one more);
* ``{rank: [layers]}`` (or a list of blocks, one per rank): ``{0: [0, 1], 1: [2, 3]}``;
* device-map-like ``{layer | "embed" | "head": rank}``: ``{"embed": 0, 0: 0, 1: 0, 2: 1, 3: 1, "head": 1}``.

Keys may be strings (JSON). A bad plan is one :class:`~parity.errors.ParityInputError` naming the
plan expected and the one found. No torch here: the CLI checks a plan before importing it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ParityInputError


@dataclass(frozen=True)
class Stage:
    """One rank's share: its layers, and whether it runs the embedding / the head."""

    rank: int
    layers: tuple[int, ...]
    embed: bool
    head: bool

    @property
    def parts(self) -> list[Any]:
        """The device-map keys this rank builds (``dsv4.load_model(only=...)``)."""
        return (["embed"] if self.embed else []) + list(self.layers) + (["head"] if self.head else [])


@dataclass(frozen=True)
class PipelinePlan:
    num_layers: int
    stages: tuple[Stage, ...]

    @property
    def size(self) -> int:
        return len(self.stages)

    def blocks(self) -> dict[int, list[int]]:
        return {s.rank: list(s.layers) for s in self.stages}


def even_plan(num_layers: int, size: int) -> dict[int, list[int]]:
    """``num_layers`` over ``size`` ranks in contiguous blocks whose lengths differ by at most one."""
    _check_size(num_layers, size)
    base, extra = divmod(num_layers, size)
    out, start = {}, 0
    for r in range(size):
        n = base + (r < extra)
        out[r] = list(range(start, start + n))
        start += n
    return out


def make_plan(num_layers: int, size: int, spec: Any = None) -> PipelinePlan:
    """The checked plan of ``spec`` (any spelling of the module docstring) for ``size`` ranks."""
    _check_size(num_layers, size)
    if spec is None:
        blocks = even_plan(num_layers, size)
    else:
        blocks = _blocks(spec, num_layers, size)
    problem = _problem(blocks, num_layers, size)
    if problem:
        raise ParityInputError(f"pipeline plan: expected {size} rank(s) 0..{size - 1}, each with a non-empty contiguous "
                               f"block of layers, the blocks in rank order covering layers 0..{num_layers - 1} once "
                               f"(e.g. {even_plan(num_layers, size)}), found {_show(spec)}: {problem}")
    last = size - 1
    return PipelinePlan(num_layers, tuple(Stage(r, tuple(blocks[r]), r == 0, r == last) for r in range(size)))


def _check_size(num_layers: int, size: int) -> None:
    if size < 1 or size > num_layers:
        raise ParityInputError(f"pipeline plan: expected 1..{num_layers} ranks (at least one layer each, "
                               f"num_hidden_layers={num_layers}), found {size} ranks")


def _key(k: Any) -> Any:
    """JSON keys are strings: '3' is layer / rank 3."""
    if isinstance(k, str) and k.strip().lstrip("-").isdigit():
        return int(k)
    return k


def _blocks(spec: Any, num_layers: int, size: int) -> dict[Any, list[Any]]:
    """``{rank: [layers]}`` from any spelling; the shape of each value is checked by :func:`_problem`."""
    bad = ParityInputError(f"pipeline plan: expected {{rank: [layers]}}, a list of blocks or {{layer | 'embed' | "
                           f"'head': rank}}, found {_show(spec)}")
    if isinstance(spec, (list, tuple)):
        return {r: b for r, b in enumerate(spec)}
    if not isinstance(spec, Mapping) or not spec:
        raise bad
    items = {_key(k): v for k, v in spec.items()}
    if all(isinstance(v, (list, tuple)) for v in items.values()):
        return {k: list(v) for k, v in items.items()}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items.values()):
        raise bad
    # device-map-like: layer -> rank; the embedding and the head may be named but must sit at the ends
    for part, want in (("embed", 0), ("head", size - 1)):
        got = items.pop(part, want)
        if got != want:
            raise ParityInputError(f"pipeline plan: expected {part!r} on rank {want} (the "
                                   f"{'first' if want == 0 else 'last'} rank), found it on rank {got}")
    out: dict[Any, list[Any]] = {}
    for layer, rank in sorted(items.items(), key=lambda kv: (not isinstance(kv[0], int), str(kv[0]).zfill(9))):
        out.setdefault(rank, []).append(layer)
    return out


def _problem(blocks: Mapping[Any, list[Any]], num_layers: int, size: int) -> str:
    """What is wrong with ``{rank: [layers]}``, or '' for a good plan."""
    ranks = sorted(blocks, key=str)
    if set(blocks) != set(range(size)):
        return f"ranks {ranks}"
    flat = [x for r in range(size) for x in blocks[r]]
    odd = [x for x in flat if not (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < num_layers)]
    if odd:
        return f"{odd} not layer indices 0..{num_layers - 1}"
    empty = [r for r in range(size) if not blocks[r]]
    if empty:
        return f"rank(s) {empty} without layers"
    twice = sorted(x for x, n in Counter(flat).items() if n > 1)
    if twice:
        return f"layer(s) {twice} on more than one rank (overlap)"
    missing = sorted(set(range(num_layers)) - set(flat))
    if missing:
        return f"layer(s) {missing} on no rank (gap)"
    for r in range(size):
        b = blocks[r]
        if b != list(range(b[0], b[0] + len(b))):
            return f"rank {r}'s layers {b} not one ascending contiguous block"
    if flat != list(range(num_layers)):
        return f"blocks out of rank order (layers {flat} in rank order)"
    return ""


def _show(spec: Any) -> str:
    return "the default even split" if spec is None else repr(spec)


__all__ = ["PipelinePlan", "Stage", "even_plan", "make_plan"]
