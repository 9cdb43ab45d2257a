"""Weight audit: what a backend's kernel actually reads for every NVFP4 weight the model serves, obtained
through the kernel itself and compared exactly with the reference's own dequantization of the same
stored tensors (``reference.dequant``, a decoder independent of ``dsv4.numerics``).

The kernel's view comes from GEMMs against an identity activation, which NVFP4 represents exactly
(code 1.0, block scale 1.0, global scale 1.0): ``y = I @ W^T`` is ``W^T`` itself. Two passes:

1. weight global scale replaced by 1.0: the output is ``e2m1 * e4m3`` (<= 6 significant bits, exact in
   BF16), so nibble order, the scale layout / swizzle, the scale grid and out-of-bounds scale reads show
   as exact mismatches;
2. the stored global scale: ``bf16(fp32(e2m1 * e4m3 * g))`` must match bit for bit (one FP32 rounding
   and one BF16 cast on both sides), which catches a wrong or missing global scale / alpha.

Pass 2 runs first, over every weight; pass 1 runs only where pass 2 found a mismatch (a dense module
whole, a bank's experts with a finding), so a clean backend costs one identity pass, not two. Pass 2
alone finds every fault pass 1 finds: two distinct products ``v != v'`` of <= 6 significant bits differ
by >= 2^-6 relative, while one FP32 rounding and one BF16 cast move each by <= 2^-9 relative, so
``bf16(fp32(v' * g)) != bf16(fp32(v * g))`` (zero and NaN compare exactly; ``g`` a normal FP32, as
stored). The one fault pass 2 misses, a wrong decode exactly compensated by a wrong global scale on
every element, leaves the GEMM right for every activation (it is linear). Pass 1 adds localization:
codes / block scales wrong, or only the global scale. Findings and their order are those of running
both passes everywhere (a dense module's pass 1 before its pass 2, a bank's by (expert, pass)).

The identity is fed in chunks of rows (and experts), so memory stays at one chunk of output.

A backend that serves dense weights through more than one kernel, chosen by the call's size (sm_90a:
the generic kernel, and ``PrefillGemm``'s dequantization + cuBLAS from 64 tokens), says so with
``weight_routes()``: ``(label, gemm)`` pairs, each forcing one route. Every dense weight is audited
through each route (findings name the route); without it, one identity chunk's size would pick one
route and the other kernel's weight reads would go unaudited. Routes taken only by a handful of rows
(the decode kernels, M <= 16) would cost K/16 whole-weight passes each; they stay covered by the
per-call audit's bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from dsv4.checkpoint.formats import NVFP4, StoredWeight, WeightFormat
from dsv4.kernels.contract import FP4Operand, GemmRequest, GroupedGemmRequest
from dsv4.layers.grouped_linear import Fp4GroupedLinear
from dsv4.layers.linear import Fp4Linear
from reference.dequant import dequant_nvfp4

from .calls import linear_scales

CHUNK_ROWS = 1024
BATCH_ELEMENTS = 1 << 26   # output elements of one grouped call (128 MiB of BF16)
_E2M1_ONE = 2          # code of +1.0
_E4M3_ONE = 0x38       # byte of 1.0
MAX_EXAMPLES = 5


@dataclass
class WeightMismatch:
    module: str
    component: str
    expert: int | None
    passname: str       # "codes*scales" (global 1.0) or "with global scale"
    mismatches: int
    elements: int
    examples: list[str] = field(default_factory=list)
    route: str = ""     # the backend's route that read the weight (``weight_routes``); "" with one route

    def describe(self) -> str:
        e = f" expert {self.expert}" if self.expert is not None else ""
        via = f" via {self.route}" if self.route else ""
        return (f"{self.module}{e} [{self.component}]{via} {self.passname}: {self.mismatches} of {self.elements} "
                f"weights differ from the reference's dequantization; first {', '.join(self.examples[:2])}")


@dataclass
class WeightAudit:
    backend: str
    modules: int = 0
    weights: int = 0
    mismatches: list[WeightMismatch] = field(default_factory=list)
    audited: list[tuple[str, str]] = field(default_factory=list)     # (module, component)
    passes_run: int = 0     # identity passes: one per module (and per dense route) when clean; a bank's pass 1 once

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def summary(self) -> dict[str, Any]:
        return {"backend": self.backend, "modules": self.modules, "weights": self.weights,
                "mismatching": [m.__dict__ for m in self.mismatches], "passes_run": self.passes_run}


def weight_records(wa: WeightAudit, ctx: Any, pair: str, prompt_mode: str) -> list[dict[str, Any]]:
    """``weight_mismatches`` per component probe (0 for every component audited clean), run-level."""
    from ..records import ALL_PROMPTS, AUDIT_MODE
    from .auditor import probe_for

    counts: dict[str, int] = {probe_for(m, c): 0 for m, c in wa.audited}
    for mm in wa.mismatches:
        counts[probe_for(mm.module, mm.component)] += mm.mismatches
    return [ctx.record(prompt_id=ALL_PROMPTS, prompt_mode=prompt_mode, pair=pair, compare_mode=AUDIT_MODE,
                       probe=probe, metric="weight_mismatches", value=v) for probe, v in counts.items()]


def fp4_modules(model: Any) -> list[Fp4Linear | Fp4GroupedLinear]:
    """Every NVFP4 linear the model computes with, in model order (a streamed model's layers are all built
    and held for the list: :func:`fp4_modules_by_part` walks them one at a time)."""
    return [m for part in fp4_modules_by_part(model) for m in part]


def fp4_modules_by_part(model: Any) -> Iterator[list[Fp4Linear | Fp4GroupedLinear]]:
    """The NVFP4 linears of each layer, then of the head, one part at a time: a streamed model
    (``dsv4.streamed``) builds each layer when its turn comes and drops it after."""
    from dsv4.model import layer_objects

    for part in _parts(model):
        yield [o for o in layer_objects(part) if isinstance(o, (Fp4Linear, Fp4GroupedLinear))]


def _parts(model: Any) -> Iterator[Any]:
    yield from getattr(model, "blocks", [])       # a streamed model builds each layer as the walk reaches it
    yield getattr(model, "head_module", None)


def identity_operand(rows: range, k: int, device: torch.device) -> FP4Operand:
    """Rows ``rows`` of the K x K identity in NVFP4 (exact): code 1.0 on the diagonal, scales 1.0, g 1.0."""
    n = len(rows)
    codes = torch.zeros(n, k, dtype=torch.uint8, device=device)
    codes[torch.arange(n, device=device), torch.tensor(list(rows), device=device)] = _E2M1_ONE
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()
    scales = torch.full((n, k // 16), _E4M3_ONE, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    return FP4Operand(packed, scales, torch.ones((), dtype=torch.float32, device=device), k=k)


def _reference_view(packed: torch.Tensor, scales: torch.Tensor, g: torch.Tensor, k: int) -> torch.Tensor:
    n = int(packed.shape[0])
    sw = StoredWeight({"weight": packed, "weight_scale": scales, "weight_scale_2": g.reshape(())},
                      WeightFormat(NVFP4, (n, k), "U8", (1, 16), "F8_E4M3"))
    return dequant_nvfp4(sw)


def audit_weights(model: Any, backend: Any | None = None, *, chunk_rows: int = CHUNK_ROWS,
                  progress: Callable[[int, int], None] | None = None) -> WeightAudit:
    """Audit every NVFP4 weight of ``model`` through ``backend`` (default: each module's own dispatcher's)."""
    result = WeightAudit(backend=getattr(backend, "name", ""))
    names: set[str] = set()
    n_parts = len(getattr(model, "blocks", [])) + 1
    for i, mods in enumerate(fp4_modules_by_part(model)):
        for mod in mods:
            be = backend or mod.dispatcher.backend
            names.add(mod.dispatcher.name)
            result.modules += 1
            result.audited.append((mod.name, mod.component))
            if isinstance(mod, Fp4GroupedLinear):
                _audit_bank(be, mod, result, chunk_rows)
            else:
                _audit_dense(dense_routes(be), mod, result, chunk_rows)
        if progress:
            progress(i + 1, n_parts)
    result.backend = result.backend or ",".join(sorted(names))
    return result


def _passes(g: torch.Tensor) -> tuple[tuple[str, torch.Tensor], ...]:
    """(pass 1, pass 2): index 0 global scale 1.0, index 1 the stored global scale."""
    return (("codes*scales (global 1.0)", torch.ones_like(g, dtype=torch.float32)), ("with global scale", g))


def dense_routes(backend: Any) -> list[tuple[str, Callable[[GemmRequest], torch.Tensor]]]:
    """``(label, gemm)`` per route the backend serves dense weights by (``weight_routes()``), else its
    ``gemm`` alone with an empty label."""
    routes = getattr(backend, "weight_routes", None)
    return list(routes()) if routes is not None else [("", backend.gemm)]


def _audit_dense(routes: Sequence[tuple[str, Callable[[GemmRequest], torch.Tensor]]], mod: Any,
                 result: WeightAudit, chunk_rows: int) -> None:
    """Both passes through every route; the reference's view of each pass is made once (pass 1 only
    after a finding) and shared by the routes."""
    w = mod.weight_operand()
    n, k = w.rows, w.k
    scales = linear_scales(w)
    result.weights += n * k
    passes = _passes(w.global_scale)
    want: dict[int, torch.Tensor] = {}           # pass index -> the reference's view [K, N]
    for route, gemm in routes:
        found: list[WeightMismatch] = []
        for pi in (1, 0):                          # pass 2; pass 1 only after a finding (listed first)
            if pi == 0 and not found:
                break
            result.passes_run += 1
            passname, g = passes[pi]
            op = FP4Operand(w.packed, w.scales, g, k=k, scale_layout=w.scale_layout)
            if pi not in want:
                want[pi] = _reference_view(w.packed, scales, g.to(torch.float32), k).T
            want_all = want[pi]
            bad, examples = 0, []
            for k0 in range(0, k, chunk_rows):
                rows = range(k0, min(k, k0 + chunk_rows))
                nb, ex = _compare(_kernel_view(gemm, op, rows), want_all[k0:rows.stop].to(torch.bfloat16), k0)
                bad += nb
                examples += ex[: MAX_EXAMPLES - len(examples)]
            if bad:
                found.insert(0, WeightMismatch(mod.name, mod.component, None, passname, bad, n * k, examples, route))
        result.mismatches += found


def _audit_bank(be: Any, mod: Any, result: WeightAudit, chunk_rows: int) -> None:
    """An expert bank: one grouped GEMM serves a batch of experts (the identity chunk once per expert,
    the others empty), so the calls number experts / batch, not experts (thousands at real width).
    Pass 2 over every expert; pass 1 over the experts pass 2 found, batched the same way."""
    op = mod.weight_operand()
    E, n, k = mod.groups, mod.n_per_group, op.k
    scales = linear_scales(op, rows=E * n, groups=E)
    result.weights += E * n * k
    batch = max(1, BATCH_ELEMENTS // (min(chunk_rows, k) * n))
    found: dict[tuple[int, int], list[Any]] = {}
    passes = _passes(op.global_scale.reshape(E))
    experts: list[int] = list(range(E))
    for pi in (1, 0):
        if not experts:
            break
        result.passes_run += 1
        passname, g = passes[pi]
        b = FP4Operand(op.packed, op.scales, g, k=k, scale_layout=op.scale_layout)
        for i in range(0, len(experts), batch):
            es = experts[i:i + batch]
            for k0 in range(0, k, chunk_rows):
                rows = range(k0, min(k, k0 + chunk_rows))
                got = _bank_view(be, b, es, rows)                      # [len(es) * r, n]
                r = len(rows)
                wants = [_reference_view(op.packed[e * n:(e + 1) * n, k0 // 2:rows.stop // 2].contiguous(),
                                         scales[e * n:(e + 1) * n, k0 // 16:rows.stop // 16].contiguous(),
                                         g[e].to(torch.float32), r).T.to(torch.bfloat16) for e in es]
                if not _differs(got, torch.cat(wants)):   # the common case: one host read a batch
                    continue
                for j, e in enumerate(es):                 # a difference: found and named per expert
                    nb, ex = _compare(got[j * r:(j + 1) * r], wants[j], k0)
                    if nb:
                        f = found.setdefault((e, pi), [passname, 0, []])
                        f[1] += nb
                        f[2] += ex[: MAX_EXAMPLES - len(f[2])]
        experts = sorted({e for e, _ in found})
    for (e, _), (passname, bad, examples) in sorted(found.items()):
        result.mismatches.append(WeightMismatch(mod.name, mod.component, e, passname, bad, n * k, examples))


def _kernel_view(gemm: Callable[[GemmRequest], torch.Tensor], w: FP4Operand, rows: range) -> torch.Tensor:
    """``I[rows] @ W^T`` through one of the backend's GEMM routes."""
    return gemm(GemmRequest(identity_operand(rows, w.k, w.device), w))


def _bank_view(backend: Any, b: FP4Operand, experts: Sequence[int], rows: range) -> torch.Tensor:
    """``I[rows] @ W_e^T`` for every expert e of ``experts`` (ascending), stacked, through one grouped GEMM."""
    i = identity_operand(rows, b.k, b.device)
    m = len(experts)
    a = FP4Operand(i.packed.repeat(m, 1), i.scales.repeat(m, 1), i.global_scale, k=b.k)
    E = int(b.global_scale.numel())
    counts = torch.zeros(E + 1, dtype=torch.int32)
    counts[torch.tensor(list(experts), dtype=torch.long) + 1] = len(rows)
    offsets = torch.cumsum(counts, 0, dtype=torch.int32).to(b.device)
    return backend.grouped_gemm(GroupedGemmRequest(a, b, offsets, b.global_scale.to(torch.float32)))


def _mismatch(got: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask of differing elements, NaN equal to NaN; got and want as FP32)."""
    g, w = got.to(torch.float32), want.to(torch.float32)
    return ~((g == w) | (torch.isnan(g) & torch.isnan(w))), g, w


def _differs(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Whether any element differs, in one host read."""
    return bool(_mismatch(got, want)[0].any())


def _compare(got: torch.Tensor, want: torch.Tensor, k0: int) -> tuple[int, list[str]]:
    diff, g, w = _mismatch(got, want)
    bad = diff.nonzero()
    ex = [f"W[{int(n)}, {int(k) + k0}]: expected {float(w[k, n]):.6g}, got {float(g[k, n]):.6g}"
          for k, n in bad[:MAX_EXAMPLES].tolist()]
    return int(bad.shape[0]), ex
