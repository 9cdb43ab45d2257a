"""PrecisionPlan: which format each component class computes in. Data, not code (docs/design.md principle 4).

A plan maps every plan class of ``dsv4.probes.PLAN_CLASSES`` to one format:

* ``fp4``  : NVFP4 W4A4 (E2M1 elements, E4M3 scale per 16, FP32 global scales) through the kernel
             backend (nvfp4-and-kernels.md §3);
* ``fp8``  : on a linear, FP8 E4M3 weights with 128x128 UE8M0 blocks and per-token 128-wide UE8M0
             activation blocks, the official recipe (spec dsv4-architecture.md §2.3, §12); on
             ``kv_cache``, the §12 format: dims [0, nope) in FP8 blocks of 64, rope dims BF16;
* ``bf16`` : dequantized weights in BF16, BF16 activations, FP32 accumulation; on ``kv_cache``, no
             quantization of the cached KV.

Presets (``default``, ``all-fp4``, ``all-bf16``) are tables below; a TOML/dict plan is a preset
(``base``) plus ``[components]`` overrides. Nothing here imports torch.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .probes import PLAN_CLASSES

try:
    import tomllib
except ImportError:  # Python 3.10 (the GPU machine may lack 3.11)
    import tomli as tomllib  # type: ignore[no-redef]

# fp32 is a whole-model mode for the logic column (every class fp32, FP32 activations), never mixed.
FORMATS = ("fp4", "fp8", "bf16", "fp32")

# Which formats each class accepts. kv_cache holds activations, never weights: NVFP4 W4A4 has no
# meaning there (spec §12 stores the cache nope dims in FP8 or not at all).
LEGAL_FORMATS: Mapping[str, tuple[str, ...]] = {
    **{c: FORMATS for c in PLAN_CLASSES if c != "kv_cache"},
    "kv_cache": ("fp8", "bf16", "fp32"),
    # the collapse is a tiny projection: NVFP4 W4A4 or high precision, never an FP8 block GEMM
    "draft_hc_head": ("fp4", "bf16", "fp32"),
}

# What each class covers (for reports and error messages).
CLASS_COVERS: Mapping[str, str] = {
    "lm_head": "head",
    "router": "ffn.gate",
    "shared_expert": "ffn.shared_experts.w1/w3/w2",
    "routed_experts": "ffn.experts.*.w1/w3/w2",
    "attn_q": "attn.wq_a, attn.wq_b",
    "attn_kv": "attn.wkv",
    "attn_o": "attn.wo_a, attn.wo_b",
    "compressor": "attn.compressor.wkv/wgate, attn.indexer.compressor.wkv/wgate",
    "indexer_q": "attn.indexer.wq_b (+ the indexer's QK fake quantization, see INDEXER_QK_TREATMENT)",
    "indexer_weights": "attn.indexer.weights_proj",
    "kv_cache": "dims [0, nope) of the window KV and the compressed KV (and the DSpark rings)",
    "draft_main_proj": "mtp.0.main_proj (the join of the target layers' hidden states)",
    "draft_attn_q": "mtp.*.attn.wq_a, attn.wq_b",
    "draft_attn_kv": "mtp.*.attn.wkv (block rows and ring entries)",
    "draft_attn_o": "mtp.*.attn.wo_a, attn.wo_b",
    "draft_router": "mtp.*.ffn.gate",
    "draft_shared_expert": "mtp.*.ffn.shared_experts.w1/w3/w2",
    "draft_routed_experts": "mtp.*.ffn.experts.*.w1/w3/w2",
    "draft_hc_head": "mtp.<last>.hc_head_fn (the drafter's collapse; fp4 = its projection as an NVFP4 GEMM)",
    "draft_markov_head": "mtp.<last>.markov_head.markov_w2 (W2; the W1 lookup is a table read)",
    "draft_confidence_head": "mtp.<last>.confidence_head.proj",
}

_DEFAULT = {
    "lm_head": "bf16", "router": "bf16", "shared_expert": "fp4", "routed_experts": "fp4", "attn_q": "fp4",
    "attn_kv": "fp4", "attn_o": "fp4", "compressor": "bf16", "indexer_q": "fp4", "indexer_weights": "bf16",
    "kv_cache": "fp8",
    # the draft mirrors the trunk: its block linears FP4, its router and heads high precision
    "draft_main_proj": "fp4", "draft_attn_q": "fp4", "draft_attn_kv": "fp4", "draft_attn_o": "fp4",
    "draft_router": "bf16", "draft_shared_expert": "fp4", "draft_routed_experts": "fp4", "draft_hc_head": "bf16",
    "draft_markov_head": "bf16", "draft_confidence_head": "bf16",
}
PRESETS: Mapping[str, Mapping[str, str]] = {
    "default": _DEFAULT,
    "all-fp4": {c: ("fp8" if c == "kv_cache" else "fp4") for c in PLAN_CLASSES},
    "all-bf16": {c: "bf16" for c in PLAN_CLASSES},
    "all-fp32": {c: "fp32" for c in PLAN_CLASSES},
}

# The indexer's official QAT (spec §7 step 3-4, §12): Hadamard(di)/sqrt(di), then FP4 E2M1 fake
# quantization with power-of-two scales per 32 of q (after RoPE) and of the keys. The probe table
# (dsv4.probes) assigns both indexer.q and indexer.k to ``indexer_q``, so that class decides it:
# any quantized format keeps the trained QAT; bf16 removes every quantization from the QK path.
INDEXER_QK_TREATMENT: Mapping[str, str] = {"fp4": "hadamard+fp4", "fp8": "hadamard+fp4", "bf16": "none", "fp32": "none"}

_TOP_KEYS = ("base", "components", "name")


class PlanError(ValueError):
    """An invalid precision plan: the message names what was expected and what was found."""


def _check_components(comp: Mapping[str, Any], where: str) -> None:
    if not isinstance(comp, Mapping):
        raise PlanError(f"plan {where}: expected a table of class = format, found {type(comp).__name__}")
    for cls, fmt in comp.items():
        if cls not in LEGAL_FORMATS:
            raise PlanError(f"plan {where}: unknown component class: expected one of {list(PLAN_CLASSES)}, "
                            f"found {cls!r}")
        if fmt not in FORMATS:
            raise PlanError(f"plan {where}: class {cls!r}: unknown format: expected one of {list(FORMATS)}, "
                            f"found {fmt!r}")
        if fmt not in LEGAL_FORMATS[cls]:
            raise PlanError(f"plan {where}: class {cls!r}: illegal format: expected one of "
                            f"{list(LEGAL_FORMATS[cls])}, found {fmt!r} ({cls} covers {CLASS_COVERS[cls]})")


@dataclass(frozen=True)
class PrecisionPlan:
    """An immutable, hashable plan: the full class -> format table, and the preset it was written
    against (``base``, used for ``overrides`` only: equality and ``key`` depend on the table alone)."""

    base: str = field(compare=False)
    components: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.base not in PRESETS:
            raise PlanError(f"plan base: expected one of {list(PRESETS)}, found {self.base!r}")
        comp = dict(self.components)
        _check_components(comp, f"(base {self.base!r})")
        missing = [c for c in PLAN_CLASSES if c not in comp]
        if missing:
            raise PlanError(f"plan: expected a format for every class, found none for {missing}")
        fp32 = sorted(c for c, f in comp.items() if f == "fp32")
        if fp32 and len(fp32) != len(comp):
            raise PlanError(f"plan: fp32 is a whole-model mode (the FP32 logic column, preset 'all-fp32'): expected "
                            f"every class or none in fp32, found only {fp32}")
        # canonical order, so equal plans compare and hash equal
        object.__setattr__(self, "components", tuple((c, comp[c]) for c in PLAN_CLASSES))

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> "PrecisionPlan":
        if name not in PRESETS:
            raise PlanError(f"plan preset: expected one of {list(PRESETS)}, found {name!r}")
        return cls(name, tuple(PRESETS[name].items()))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PrecisionPlan":
        """``{"base": "default", "components": {"lm_head": "fp4"}}``; ``name`` (as written by
        :meth:`to_dict`) is accepted and must match the plan it describes."""
        if not isinstance(d, Mapping):
            raise PlanError(f"plan: expected a table with 'base' and 'components', found {type(d).__name__}")
        unknown = sorted(set(d) - set(_TOP_KEYS))
        if unknown:
            raise PlanError(f"plan: unknown keys: expected only {list(_TOP_KEYS)}, found {unknown}")
        base = d.get("base", "default")
        if base not in PRESETS:
            raise PlanError(f"plan base: expected one of {list(PRESETS)}, found {base!r}")
        over = d.get("components", {})
        _check_components(over, f"(base {base!r}) [components]")
        plan = cls(base, tuple({**PRESETS[base], **over}.items()))
        if "name" in d and d["name"] != plan.name:
            raise PlanError(f"plan name: expected {plan.name!r} for these components, found {d['name']!r}")
        return plan

    @classmethod
    def from_toml(cls, path_or_text: str | Path) -> "PrecisionPlan":
        """A TOML file path or TOML text: ``base = "default"`` and a ``[components]`` table."""
        text, where = _toml_source(path_or_text)
        try:
            d = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise PlanError(f"plan TOML {where}: expected valid TOML, found a syntax error: {e}") from None
        return cls.from_dict(d)

    def replace(self, **changes: str) -> "PrecisionPlan":
        """A new plan with some classes changed (same base), e.g. ``plan.replace(lm_head="fp4")``."""
        _check_components(changes, f"(base {self.base!r}) replace")
        return PrecisionPlan(self.base, tuple({**dict(self.components), **changes}.items()))

    # ---- queries --------------------------------------------------------------------------------
    def __getitem__(self, cls: str) -> str:
        comp = dict(self.components)
        if cls not in comp:
            raise PlanError(f"plan lookup: unknown component class: expected one of {list(PLAN_CLASSES)}, "
                            f"found {cls!r}")
        return comp[cls]

    def fmt(self, cls: str) -> str:
        return self[cls]

    def overrides(self) -> dict[str, str]:
        """Classes whose format differs from the base preset."""
        base = PRESETS[self.base]
        return {c: f for c, f in self.components if base[c] != f}

    @property
    def name(self) -> str:
        """Stable: the preset name when the plan equals a preset, else ``base+cls=fmt,...``."""
        comp = dict(self.components)
        for pname, table in PRESETS.items():
            if dict(table) == comp:
                return pname
        return self.base + "+" + ",".join(f"{c}={f}" for c, f in sorted(self.overrides().items()))

    def key(self) -> str:
        """A short stable hash of the full table (cache keys; equal plans give equal keys)."""
        blob = json.dumps(dict(self.components), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def act_dtype(self) -> str:
        """The activation dtype the plan computes in: ``fp32`` for the all-fp32 logic plan, else ``bf16``."""
        return "fp32" if self.components[0][1] == "fp32" else "bf16"

    def fp4_classes(self) -> list[str]:
        return [c for c, f in self.components if f == "fp4"]

    # ---- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "components": dict(self.components)}

    def to_toml(self) -> str:
        lines = [f'base = "{self.base}"', "", "[components]"]
        lines += [f'{c} = "{f}"' for c, f in self.components]
        return "\n".join(lines) + "\n"

    def __str__(self) -> str:
        return self.name


def _toml_source(path_or_text: str | Path) -> tuple[str, str]:
    if isinstance(path_or_text, Path):
        p = path_or_text
    elif "\n" in path_or_text or "=" in path_or_text:
        return path_or_text, "(text)"
    else:
        p = Path(path_or_text)
    try:
        return p.read_text(), str(p)
    except FileNotFoundError:
        raise PlanError(f"plan TOML: expected a file or TOML text, found no file {str(p)!r}") from None


def resolve_plan(plan: "str | Path | Mapping[str, Any] | PrecisionPlan") -> PrecisionPlan:
    """A preset name, a TOML path or text, a dict, or a plan."""
    if isinstance(plan, PrecisionPlan):
        return plan
    if isinstance(plan, Mapping):
        return PrecisionPlan.from_dict(plan)
    if isinstance(plan, str) and plan in PRESETS:
        return PrecisionPlan.preset(plan)
    if isinstance(plan, (str, Path)):
        s = str(plan)
        if isinstance(plan, Path) or s.endswith(".toml") or "=" in s or "\n" in s:
            return PrecisionPlan.from_toml(plan)
        raise PlanError(f"plan: expected a preset {list(PRESETS)}, a .toml path, TOML text or a dict, found {s!r}")
    raise PlanError(f"plan: expected a preset name, TOML, a dict or a PrecisionPlan, found {type(plan).__name__}")


__all__ = ["FORMATS", "LEGAL_FORMATS", "PRESETS", "INDEXER_QK_TREATMENT", "PlanError", "PrecisionPlan",
           "resolve_plan"]
