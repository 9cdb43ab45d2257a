"""Every GEMM of one DeepSeek-V4 layer (each layer kind) and the LM head, as (N, K) shapes: the table
``bench_nvfp4_shapes.py`` times. Pure: no torch, no cutlass, no CUDA.

The shapes come from the project's weight list (``dsv4.checkpoint.names``: the logical ``[out, in]``
of every linear, per layer kind) and the config: q down/up (``wq_a``, ``wq_b``), the single KV head
(``wkv``), the grouped low-rank output (``wo_a``: ``o_groups`` groups, every token in every group;
``wo_b``), the CSA / HCA compressors (``wkv``, ``wgate``; CSA's twice as wide), the lightning
indexer (``wq_b``, ``weights_proj``, its compressor), the router (``ffn.gate``), the shared expert
(``w1``/``w3`` fused with the SwiGLU: N = 2 * inter; ``w2``), the routed experts as grouped GEMMs over
``n_routed_experts`` with ``num_experts_per_tok`` per token (w13 + SwiGLU, w2) and the LM head. The
configs are the real Flash and Pro ones, built as ``bench_real_width.py`` builds them (a few layers
covering every layer kind at the exact widths). Identical ``(n, k, swiglu, grouped)`` shapes of one
model are timed once, with every name kept. ``formats`` says what the default precision plan computes
each name in (the bench times every shape regardless).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_real_width import DEFAULT_LAYERS, bench_config  # noqa: E402

MODELS = ("flash", "pro")
K_ALIGN = 32     # the sm_90a kernels need K % 32 == 0 (16-byte FP4 rows)


@dataclass(frozen=True)
class Shape:
    model: str
    name: str                        # the names joined with '+'
    names: tuple[str, ...]           # canonical weight names (compressors tagged with their layer kind)
    n: int                           # weight rows (with SwiGLU: [gate; up], the output is n // 2 wide)
    k: int
    swiglu: bool = False
    # (groups, top_k): routed experts (n_routed_experts, num_experts_per_tok); (o_groups, None): wo_a,
    # every token in every group. None: a dense GEMM.
    grouped: tuple[int, int | None] | None = None
    classes: tuple[str, ...] = ()    # precision-plan class of each name
    formats: tuple[str, ...] = ()    # its format in the default plan

    @property
    def key(self) -> tuple[int, int, bool, tuple[int, int | None] | None]:
        return (self.n, self.k, self.swiglu, self.grouped)

    @property
    def n_out(self) -> int:
        return self.n // 2 if self.swiglu else self.n

    @property
    def routed(self) -> bool:
        return self.grouped is not None and self.grouped[1] is not None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "name": self.name, "names": list(self.names), "n": self.n, "k": self.k,
                "swiglu": self.swiglu, "grouped": list(self.grouped) if self.grouped else None,
                "classes": list(self.classes), "formats": list(self.formats)}


def model_config(model: str) -> Any:
    """The real config of ``model`` ('flash' or 'pro') as bench_real_width builds it."""
    return bench_config(model, "real", DEFAULT_LAYERS[(model, "real")])


def gemm_shapes(cfg: Any, model: str | None = None) -> list[Shape]:
    """Every GEMM of every layer kind in ``cfg`` plus the LM head, deduplicated on (n, k, swiglu, grouped)."""
    from dsv4.checkpoint.names import LINEAR, component_class, global_weights, layer_weights
    from dsv4.plan import PRESETS

    model = model or cfg.name.split("-")[0]
    routed = (cfg.n_routed_experts, cfg.num_experts_per_tok)
    found: dict[tuple, list[tuple[str, str]]] = {}
    specs: dict[tuple, tuple[int, int, bool, Any]] = {}

    def add(name: str, canonical: str, n: int, k: int, swiglu: bool = False, grouped: Any = None) -> None:
        key = (n, k, swiglu, grouped)
        specs[key] = key
        entry = found.setdefault(key, [])
        if name not in [nm for nm, _ in entry]:
            entry.append((name, component_class(canonical) or "none"))

    for i in range(cfg.num_hidden_layers):
        kind = cfg.layer_kind(i)
        for s in layer_weights(cfg, i):
            if s.kind != LINEAR:
                continue
            nm, (n, k) = s.name, s.shape
            if nm.startswith("ffn.experts."):
                _, _, e, leaf = nm.split(".")
                if e != "0" or leaf == "w3":
                    continue
                if leaf == "w1":
                    add("ffn.experts.w13", nm, 2 * n, k, True, routed)
                else:
                    add("ffn.experts.w2", nm, n, k, False, routed)
            elif nm == "ffn.shared_experts.w1":
                add("ffn.shared_experts.w13", nm, 2 * n, k, True)
            elif nm == "ffn.shared_experts.w3":
                continue
            elif nm == "attn.wo_a":
                add(nm, nm, n // cfg.o_groups, k, False, (cfg.o_groups, None))
            elif ".compressor." in nm:
                add(f"{nm}[{kind}]", nm, n, k)
            else:
                add(nm, nm, n, k)
    for s in global_weights(cfg):
        if s.name == "head":
            add("head", "head", *s.shape)
    fmt = PRESETS["default"]
    return [Shape(model, "+".join(nm for nm, _ in entry), tuple(nm for nm, _ in entry), key[0], key[1], key[2],
                  key[3], tuple(c for _, c in entry), tuple(fmt.get(c, "?") for _, c in entry))
            for key, entry in found.items()]


def misaligned(shapes: list[Shape]) -> list[Shape]:
    """Shapes the sm_90a kernels cannot take as they are: a non-positive size or K % 32 != 0."""
    return [s for s in shapes if s.n <= 0 or s.k <= 0 or s.k % K_ALIGN]


def all_shapes(models: tuple[str, ...] = MODELS) -> list[Shape]:
    return [s for m in models for s in gemm_shapes(model_config(m), m)]


def describe(shape: Shape) -> str:
    g = ""
    if shape.grouped:
        e, t = shape.grouped
        g = f" grouped {e} experts top-{t}" if t else f" grouped {e} groups (every token)"
    return (f"{shape.model:5s} {shape.name:64s} n={shape.n:6d} k={shape.k:5d}{' swiglu' if shape.swiglu else ''}{g}"
            f"  [{', '.join(sorted(set(shape.formats)))}]")


if __name__ == "__main__":
    for s in all_shapes():
        print(describe(s))
