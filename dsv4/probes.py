"""Probe names (the normative list: docs/model_surface.md) and a tiny emit/record bus.

Both models call ``emit(name, tensor)`` at every probe point. With no recorder active this is one
ContextVar read and a ``None`` check, so it costs nothing measurable. The harness activates a
``ProbeRecorder`` (a context manager) to capture tensors. No torch compute lives here: the
reference may import this module.
"""
from __future__ import annotations

import contextvars
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

# (probe name template, component class). Execution order within a layer.
LAYER_PROBES: tuple[tuple[str, str], ...] = (
    ("hc.attn.pre", "mhc"),
    ("attn.q", "attn_q"),
    ("attn.kv", "attn_kv"),
    ("attn.compressed_kv", "compressor"),
    ("attn.indexer.q", "indexer_q"),
    ("attn.indexer.k", "indexer_q"),
    ("attn.indexer.scores", "indexer_weights"),
    ("attn.indexer.topk", "indexer_weights"),
    ("attn.core", "attention"),
    ("attn.out", "attn_o"),
    ("hc.attn.post", "mhc"),
    ("hc.ffn.pre", "mhc"),
    ("ffn.router.logits", "router"),
    ("ffn.router.topk_ids", "router"),
    ("ffn.router.weights", "router"),
    ("ffn.routed.out", "routed_experts"),
    ("ffn.shared.out", "shared_expert"),
    ("ffn.out", "moe"),
    ("out", "mhc"),
)
GLOBAL_PROBES_BEFORE: tuple[tuple[str, str], ...] = (("embed", "embed"),)
GLOBAL_PROBES_AFTER: tuple[tuple[str, str], ...] = (("hc_head", "mhc"), ("final_norm", "final_norm"),
                                                    ("logits", "lm_head"))

# Plan classes (have weights, can be flipped) and localization-only classes.
TRUNK_PLAN_CLASSES = ("lm_head", "router", "shared_expert", "routed_experts", "attn_q", "attn_kv", "attn_o",
                      "compressor", "indexer_q", "indexer_weights", "kv_cache")
# The DSpark draft's own classes (docs/dspark.md): its stage blocks' linears mirror the trunk's classes
# with a ``draft_`` prefix, plus the join, the drafter's hc-head collapse, the Markov and confidence
# heads. The draft shares the trunk's embedding, LM head (``lm_head``) and KV storage (``kv_cache``).
DRAFT_PREFIX = "draft_"
DRAFT_PLAN_CLASSES = ("draft_main_proj", "draft_attn_q", "draft_attn_kv", "draft_attn_o", "draft_router",
                      "draft_shared_expert", "draft_routed_experts", "draft_hc_head", "draft_markov_head",
                      "draft_confidence_head")
PLAN_CLASSES = TRUNK_PLAN_CLASSES + DRAFT_PLAN_CLASSES
LOCALIZATION_CLASSES = ("mhc", "attention", "moe", "embed", "final_norm")

# The draft's probes (reference/dspark.py and dsv4/dspark emit them); its stage s reports as trunk
# layer L + s (``layers.{L+s}.*``, the official numbering).
DRAFT_PROBES: tuple[tuple[str, str], ...] = (("dspark.main_hidden", "mhc"),            # Eq 1-2, the target's capture
                                             ("dspark.join", "draft_main_proj"),       # Eq 3
                                             ("dspark.hc_head", "draft_hc_head"),
                                             ("dspark.base_logits", "lm_head"),
                                             ("dspark.logits", "draft_markov_head"),
                                             ("dspark.confidence", "draft_confidence_head"))

# A stage's probes beyond the trunk layer's: the ring entries its commit writes (Eq 4).
DRAFT_LAYER_PROBES: tuple[tuple[str, str], ...] = (("attn.context_kv", "attn_kv"),)


def draft_class(trunk_class: str) -> str:
    """The draft's plan class for a stage weight of trunk class ``trunk_class`` (``attn_q`` ->
    ``draft_attn_q``); classes the draft shares with the trunk (``kv_cache``) stay as they are."""
    c = DRAFT_PREFIX + trunk_class
    return c if c in DRAFT_PLAN_CLASSES else trunk_class

# Integer-valued probes: compared by selection agreement, never by cosine.
SELECTION_PROBES = ("attn.indexer.topk", "ffn.router.topk_ids")

_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
_LAYER_CLASS = dict(LAYER_PROBES)
_GLOBAL_CLASS = dict(GLOBAL_PROBES_BEFORE + GLOBAL_PROBES_AFTER)


def layer_probe(layer: int, suffix: str) -> str:
    return f"layers.{layer}.{suffix}"


def probe_names(num_layers: int, layer_kinds: list[str] | None = None) -> list[str]:
    """Every probe name in execution order. ``layer_kinds`` ('window'/'csa'/'hca' per layer) drops
    probes a layer kind never emits (no compressor on window layers, no indexer outside CSA)."""
    names = [n for n, _ in GLOBAL_PROBES_BEFORE]
    for i in range(num_layers):
        kind = layer_kinds[i] if layer_kinds else "csa"
        for suffix, _ in LAYER_PROBES:
            if suffix == "attn.compressed_kv" and kind == "window":
                continue
            if suffix.startswith("attn.indexer.") and kind != "csa":
                continue
            names.append(layer_probe(i, suffix))
    names += [n for n, _ in GLOBAL_PROBES_AFTER]
    return names


def parse_probe(name: str) -> tuple[int | None, str]:
    """``'layers.3.attn.q'`` -> ``(3, 'attn.q')``; ``'logits'`` -> ``(None, 'logits')``.
    Raises KeyError for a name outside the normative list."""
    m = _LAYER_RE.match(name)
    if m:
        suffix = m.group(2)
        if suffix not in _LAYER_CLASS:
            raise KeyError(f"unknown probe {name!r}: suffix {suffix!r} is not one of {sorted(_LAYER_CLASS)}")
        return int(m.group(1)), suffix
    if name not in _GLOBAL_CLASS:
        raise KeyError(f"unknown probe {name!r}: expected 'layers.<i>.<suffix>' or one of {sorted(_GLOBAL_CLASS)}")
    return None, name


def component_of(name: str) -> str:
    layer, suffix = parse_probe(name)
    return _LAYER_CLASS[suffix] if layer is not None else _GLOBAL_CLASS[suffix]


# ---- the bus ------------------------------------------------------------------------------------
_ACTIVE: contextvars.ContextVar["ProbeRecorder | None"] = contextvars.ContextVar("dsv4_probe_recorder",
                                                                                   default=None)


def active() -> bool:
    return _ACTIVE.get() is not None


def emit(name: str, value: Any) -> None:
    """Publish a probe value. Cheap no-op unless a recorder is active."""
    rec = _ACTIVE.get()
    if rec is not None:
        rec._take(name, value)


@dataclass
class ProbeRecorder:
    """Collects emitted tensors while active.

    ``include``: optional predicate or regex on the probe name. ``keep='last'`` keeps the last value
    per name (prefill); ``'all'`` appends every emission (decode steps). Tensors are detached and, if
    ``to_cpu``, copied to the CPU so device memory is not pinned by the harness. A CUDA tensor goes
    into pinned host memory without blocking, so the copies overlap the forward instead of waiting
    for the GPU at every probe (an H200, DeepSeek-V4 Pro width, 2 layers, 1,024 tokens, 38 probes of
    1.6 GB: a ``cutedsl_sm90`` prefill took 0.13 s plain, 0.57 s with synchronous pageable copies,
    0.16 s with these, values equal); the values are complete once the recorder exits, or after
    :meth:`wait`. The pinned memory comes from a few slabs (``dsv4.pinned_slabs``: torch rounds every
    pinned block up to a power of two); a tensor above 256 MiB (the logits at real vocabulary and
    thousands of tokens) is copied synchronously to pageable memory instead.
    """

    include: Callable[[str], bool] | str | None = None
    keep: str = "last"
    to_cpu: bool = False
    values: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    _token: Any = field(default=None, repr=False)
    _pending: set = field(default_factory=set, repr=False)     # devices with copies in flight
    _slabs: Any = field(default=None, repr=False)              # PinnedSlabs, made at the first CUDA copy

    def __post_init__(self) -> None:
        if self.keep not in ("last", "all"):
            raise ValueError(f"ProbeRecorder.keep: expected 'last' or 'all', found {self.keep!r}")
        if isinstance(self.include, str):
            pat = re.compile(self.include)
            self.include = lambda n: bool(pat.search(n))

    def _take(self, name: str, value: Any) -> None:
        if self.include is not None and not self.include(name):  # type: ignore[operator]
            return
        if hasattr(value, "detach"):
            value = value.detach()
            if self.to_cpu:
                value = self._to_host(value)
        if name not in self.values:
            self.order.append(name)
        if self.keep == "all":
            self.values.setdefault(name, []).append(value)
        else:
            self.values[name] = value

    def _to_host(self, value: Any) -> Any:
        if not getattr(value, "is_cuda", False):
            return value.to("cpu")
        if self._slabs is None:
            from .pinned_slabs import PinnedSlabs

            self._slabs = PinnedSlabs()
        dst = self._slabs.empty(tuple(value.shape), value.dtype)
        if dst is None:
            return value.to("cpu")
        dst.copy_(value, non_blocking=True)    # ordered on the current stream after the producer
        self._pending.add(value.device)
        return dst

    def wait(self) -> None:
        """Until every host copy made so far has landed (the values are complete)."""
        if self._pending:
            import torch

            devices, self._pending = self._pending, set()
            for d in devices:
                torch.cuda.synchronize(d)

    def __enter__(self) -> "ProbeRecorder":
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._token)
        self._token = None
        try:
            self.wait()
        except Exception:
            if exc[0] is None:       # a failing forward's own error is the one to report
                raise

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __contains__(self, name: str) -> bool:
        return name in self.values

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)


class suspended:
    """Context manager: no probes are recorded inside (e.g. the harness's own helper forwards)."""

    def __enter__(self) -> None:
        self._token = _ACTIVE.set(None)

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._token)
