"""One kernel call replayed through the oracle and judged element by element against its bound.

``audit_request(op, request, output)`` -> :class:`CallCheck`: how many elements broke their bound,
the worst ratio |got - expected| / bound over every element (information: a clean call is <= 1), and
the first few violating elements with their coordinates. The oracle is :mod:`dsv4.numerics` (the
functions the ``emulated`` backend is built on); bounds are :mod:`parity.audit.bounds`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4.kernels.contract import ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest
from dsv4.numerics import (e2m1_encode, e4m3_decode, e4m3_encode, nvfp4_dequantize, nvfp4_quantize,
                           nvfp4_runtime_global_scale, swizzled_numel, unpack_nibbles, unswizzle_scales)
from dsv4.numerics.e2m1 import decode_codes_unchecked

from .bounds import BOUND_SLACK, U32, accumulation_bound, half_ulp_bf16, monotone_interval, rmsnorm_delta, swiglu_bound

OPS = ("gemm", "grouped_gemm", "quantize_activation")
MAX_EXAMPLES = 5


@dataclass
class Element:
    """One violating element: ``where`` names it (e.g. ``out[3, 17]``, ``scales[0, 2]``, ``global_scale``)."""

    where: str
    expected: float
    got: float
    bound: float

    @property
    def ratio(self) -> float:
        err = abs(self.got - self.expected)
        if err != err:      # NaN on one side only
            return float("inf")
        if self.bound > 0:
            return err / self.bound
        return float("inf") if err > 0 else 0.0

    @property
    def ulps(self) -> int | None:
        """How many FP32 values lie between expected and got (None if either is not finite)."""
        return fp32_ulps(self.expected, self.got)

    def describe(self) -> str:
        if self.bound == 0:
            u = self.ulps
            miss = f"{u} FP32 ulp{'s' if u != 1 else ''} apart; exact match required" if u is not None \
                else "exact match required"
        else:
            miss = f"{self.ratio:.3g} bounds"
        return f"{self.where}: expected {self.expected:.8g}, got {self.got:.8g} ({miss})"

    def summary(self) -> dict[str, Any]:
        return {"where": self.where, "expected": self.expected, "got": self.got, "bound": self.bound,
                "ratio": self.ratio, "ulps": self.ulps}


def fp32_ulps(a: float, b: float) -> int | None:
    """The distance of two values in FP32 steps (0 for equal values, +0 and -0 included)."""
    import math
    import struct

    if not (math.isfinite(a) and math.isfinite(b)):
        return None

    def ordinal(x: float) -> int:   # FP32 bit patterns ordered as the values are
        bits = struct.unpack("<i", struct.pack("<f", x))[0]
        return bits if bits >= 0 else -(bits & 0x7FFFFFFF)

    return abs(ordinal(a) - ordinal(b))


@dataclass
class CallCheck:
    op: str
    elements: int = 0
    violations: int = 0
    worst_ratio: float = 0.0
    examples: list[Element] = field(default_factory=list)

    def add_clean(self, elements: int, worst: float) -> None:
        """A comparison known clean (``_clean``): what ``add`` records when nothing violates."""
        self.elements += elements
        self.worst_ratio = max(self.worst_ratio, worst)

    def add(self, where: list[str], expected: torch.Tensor, got: torch.Tensor, bound: torch.Tensor,
            bad: torch.Tensor, ratio: torch.Tensor) -> None:
        self.elements += int(bad.numel())
        if bad.numel() == 0:
            return
        # one device-to-host read per comparison (each read is a sync on CUDA): the count, the worst
        # finite ratio, and whether a violating element missed an exact (infinite-ratio) bound
        fin = torch.isfinite(ratio)
        n_bad, worst, inf_bad = torch.stack([bad.sum().to(torch.float64),
                                             torch.where(fin, ratio, torch.zeros_like(ratio)).max().to(torch.float64),
                                             (bad & ~fin).any().to(torch.float64)]).tolist()
        n_bad = int(n_bad)
        self.violations += n_bad
        self.worst_ratio = max(self.worst_ratio, worst)
        if inf_bad:
            self.worst_ratio = float("inf")
        if n_bad == 0:
            return
        for idx in bad.nonzero()[: max(0, MAX_EXAMPLES - len(self.examples))].tolist():
            t = tuple(idx)
            self.examples.append(Element(_where(where, t), float(expected[t]), float(got[t]), float(bound[t])))

    @property
    def passed(self) -> bool:
        return self.violations == 0

    def worst(self) -> str:
        """The worst miss in words: ``N bounds``, or for an element that must match exactly its distance."""
        if self.worst_ratio != float("inf"):
            return f"worst {self.worst_ratio:.3g} bounds"
        exact = [e for e in self.examples if e.bound == 0 and e.ulps is not None]
        if exact:
            return f"an exact element {max(e.ulps for e in exact)} FP32 ulps off"
        return "a non-finite or exact-element mismatch"


def _where(names: list[str], idx: tuple[int, ...]) -> str:
    head, *labels = names
    coords = ", ".join(f"{lab}{i}" if lab else str(i) for lab, i in zip(labels or [""] * len(idx), idx))
    return f"{head}[{coords}]"


def _clean_worst(e: torch.Tensor, g: torch.Tensor, b: torch.Tensor, err: torch.Tensor) -> float | None:
    """The common case in one host read and a few kernels: every value finite, every bound positive
    and every error within it. Then the worst ratio (with the full judgement's clamp), else None."""
    ok = (torch.isfinite(e) & torch.isfinite(g) & (b > 0) & (err <= b)).all()
    worst, clean = torch.stack([(err / b.clamp(min=1e-38)).amax(), ok.to(torch.float32)]).tolist()
    return worst if clean == 1.0 else None


def _clean(check: CallCheck, e: torch.Tensor, g: torch.Tensor, b: torch.Tensor, err: torch.Tensor) -> bool:
    """A clean comparison (``_clean_worst``) is recorded as the full judgement would record it (its
    elements, the worst ratio) and True is returned; otherwise nothing is recorded."""
    worst = _clean_worst(e, g, b, err)
    if worst is None:
        return False
    check.add_clean(err.numel(), worst)
    return True


def _compare(check: CallCheck, where: list[str], expected: torch.Tensor, got: torch.Tensor,
             bound: torch.Tensor) -> None:
    # FP32: the difference's own rounding (2^-24 relative) is far inside the bounds' BOUND_SLACK.
    # Judged on the device of the oracle's value, which is the device the call ran on.
    e = expected.to(torch.float32)
    g, b = got.to(e.device, torch.float32), bound.to(e.device, torch.float32)
    err = (g - e).abs()
    if err.numel() and _clean(check, e, g, b, err):
        return
    both_nan = torch.isnan(e) & torch.isnan(g)
    same_inf = torch.isinf(e) & torch.isinf(g) & (torch.sign(e) == torch.sign(g))
    ok = both_nan | same_inf | (err <= b)
    ratio = torch.where(b > 0, err / b.clamp(min=1e-38), torch.where(err > 0, float("inf"), 0.0))
    ratio = torch.where(both_nan | same_inf, torch.zeros_like(ratio),
                        torch.nan_to_num(ratio, nan=float("inf"), posinf=float("inf")))
    check.add(where, e, g, b, ~ok, ratio)


# ---- GEMM ------------------------------------------------------------------------------------------
def linear_scales(op: FP4Operand, rows: int | None = None, groups: int = 1) -> torch.Tensor:
    """Scales ``[rows, K/16]`` in the linear layout (swizzled operands unswizzled, per group)."""
    if op.scale_layout == "linear":
        return op.scales
    per = (op.rows if rows is None else rows) // groups
    return torch.cat([group_scales(op, g, per) for g in range(groups)])


def group_scales(op: FP4Operand, g: int, per: int) -> torch.Tensor:
    """Group ``g``'s scales ``[per, K/16]`` (``per`` rows a group) in the linear layout."""
    sc = op.k // 16
    if op.scale_layout == "linear":
        return op.scales[g * per:(g + 1) * per]
    n = swizzled_numel(per, sc)
    return unswizzle_scales(op.scales[g * n:(g + 1) * n], per, sc)


def _dequant(op: FP4Operand, groups: int = 1) -> torch.Tensor:
    return nvfp4_dequantize(op.packed, linear_scales(op, groups=groups), 1.0)


_WEIGHTS = None


def _weight(op: FP4Operand, groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's decode of a weight operand and its magnitudes, kept while the operand's tensors live
    unchanged (dsv4.kernels.emulated_cache: identity and version checked on every hit), so a weight is
    decoded once per audit, not once per call. A hit is the very tensor the decode builds."""
    global _WEIGHTS
    if _WEIGHTS is None:
        from dsv4.kernels.emulated_cache import DecodeCache

        _WEIGHTS = DecodeCache()
    key = ("audit", op.scale_layout, op.k, groups)
    b = _WEIGHTS.get(op.packed, op.scales, key, lambda: _dequant(op, groups))
    return b, _WEIGHTS.get(op.packed, op.scales, key + ("abs",), b.abs)


def _gemm_expected(a: torch.Tensor, b: tuple[torch.Tensor, torch.Tensor], alpha: torch.Tensor, k: int,
                   swiglu_limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    acc = a @ b[0].transpose(-1, -2)   # 2-D, or batched over experts ([E, rows, K] @ [E, K, N])
    s = a.abs() @ b[1].transpose(-1, -2)
    al = alpha.to(torch.float32)
    pre = acc * al
    err = accumulation_bound(k, s) * al.abs() + (2 * U32 * BOUND_SLACK) * pre.abs()
    if swiglu_limit is None:
        out, bound = pre, err
    else:
        out, bound = swiglu_bound(pre, err, float(swiglu_limit))
    return out, (bound + half_ulp_bf16(out.abs() + bound)) * BOUND_SLACK


def audit_gemm(req: GemmRequest, got: torch.Tensor) -> CallCheck:
    check = CallCheck("gemm")
    if tuple(got.shape) != req.out_shape:
        check.add(["out.shape"], torch.tensor([float(req.out_shape[1])]), torch.tensor([float(got.shape[-1])]),
                  torch.zeros(1), torch.ones(1, dtype=torch.bool), torch.full((1,), float("inf")))
        return check
    alpha = req.a.global_scale * req.b.global_scale
    out, bound = _gemm_expected(_dequant(req.a), _weight(req.b), alpha, req.a.k, req.swiglu_limit)
    _compare(check, ["out", "m=", "n="], out, got, bound)
    return check


def audit_grouped(req: GroupedGemmRequest, got: torch.Tensor) -> CallCheck:
    check = CallCheck("grouped_gemm")
    if tuple(got.shape) != req.out_shape:
        check.add(["out.shape"], torch.tensor([float(req.out_shape[1])]), torch.tensor([float(got.shape[-1])]),
                  torch.zeros(1), torch.ones(1, dtype=torch.bool), torch.full((1,), float("inf")))
        return check
    a = _dequant(req.a)
    bank = _Bank(req.b, req.num_experts, req.n_per_expert)
    offsets = req.offsets.to("cpu").tolist()
    if _grouped_batched_clean(check, req, got, a, bank, offsets):
        return check
    for e in range(req.num_experts):
        lo, hi = offsets[e], offsets[e + 1]
        if lo == hi:
            continue
        w, wa = bank.take([e])
        out, bound = _gemm_expected(a[lo:hi], (w[0], wa[0]), req.alphas[e], req.a.k, req.swiglu_limit)
        _compare(check, [f"out(expert {e}, rows {lo}..{hi - 1})", "m=", "n="], out, got[lo:hi], bound)
    return check


BATCH_ELEMENTS = 2**27  # FP32 elements of a batched replay's weights or padded rows (512 MiB each)
# FP32 elements of a whole decoded bank kept across calls (8 GiB, and as much again for |b|): a Flash
# routed bank (256 x 4096 x 4096, 4.3e9) fits; a Pro one (384 x 6144 x 7168, 1.7e10: 63 GiB) does not
# and is decoded per expert, on demand, for the experts a call routes rows to
BANK_CACHE_ELEMENTS = 2**31


class _Bank:
    """The oracle's decode of a grouped call's weights, by expert: views of the whole decoded bank
    (cached while the operand lives, ``_weight``) where it holds at most ``BANK_CACHE_ELEMENTS``, else
    the requested experts decoded from their own rows and scales (the same values: decoding is
    elementwise), nothing kept."""

    def __init__(self, op: FP4Operand, experts: int, n: int):
        self.op, self.experts, self.n, self.k = op, experts, n, op.k
        self.whole = experts * n * op.k <= BANK_CACHE_ELEMENTS
        if self.whole:
            b, b_abs = _weight(op, groups=experts)
            self.w3, self.wa3 = b.reshape(experts, n, op.k), b_abs.reshape(experts, n, op.k)

    def take(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``([len(ids), n, K], |.|)`` for experts ``ids`` (ascending)."""
        if self.whole:
            if ids == list(range(ids[0], ids[-1] + 1)):
                return self.w3[ids[0]:ids[-1] + 1], self.wa3[ids[0]:ids[-1] + 1]
            idx = torch.tensor(ids, device=self.w3.device)
            return self.w3[idx], self.wa3[idx]
        w = self._experts(ids)
        return w, w.abs()

    def _experts(self, ids: list[int]) -> torch.Tensor:
        """Experts ``ids`` decoded in one call from their own rows and scales (no per-expert stack)."""
        n, k, op = self.n, self.k, self.op
        idx = torch.tensor(ids, device=op.packed.device)
        packed = op.packed.reshape(self.experts, n, k // 2).index_select(0, idx)
        if op.scale_layout == "linear":
            scales = op.scales.reshape(self.experts, n, k // 16).index_select(0, idx.to(op.scales.device))
        else:
            scales = torch.stack([group_scales(op, e, n) for e in ids])
        return nvfp4_dequantize(packed, scales, 1.0)


def _grouped_batched_clean(check: CallCheck, req: GroupedGemmRequest, got: torch.Tensor, a: torch.Tensor,
                           bank: _Bank, offsets: list[int]) -> bool:
    """The per-expert judgement of ``audit_grouped`` in a few batched replays: the experts that hold
    rows, in order, batched with their rows padded to the batch's largest count, one host read per
    batch instead of one per expert. The same oracle values and bounds, elementwise; True (and
    recorded as the per-expert judgement records a clean call) when every element is clean, else
    nothing is recorded and the per-expert judgement runs, so a finding reads as it always did."""
    e_all, n, k = req.num_experts, req.n_per_expert, req.a.k
    counts = [offsets[e + 1] - offsets[e] for e in range(e_all)]
    touched = [e for e in range(e_all) if counts[e]]
    per = max(1, BATCH_ELEMENTS // max(n * k, 1))
    got32 = got.to(a.device, torch.float32)
    elements, worst, i0 = 0, 0.0, 0
    while i0 < len(touched):
        i1 = min(len(touched), i0 + per)
        while i1 - i0 > 1 and (i1 - i0) * max(counts[e] for e in touched[i0:i1]) * k > BATCH_ELEMENTS:
            i1 -= 1
        ids = touched[i0:i1]
        rmax = max(counts[e] for e in ids)
        rows = [[offsets[e] + min(t, counts[e] - 1) for t in range(rmax)] for e in ids]  # padding: a real row
        valid = torch.tensor([[t < counts[e] for t in range(rmax)] for e in ids], device=a.device)
        idx = torch.tensor(rows, device=a.device)
        alpha = req.alphas[torch.tensor(ids, device=req.alphas.device)].to(a.device).reshape(-1, 1, 1)
        out, bound = _gemm_expected(a[idx], bank.take(ids), alpha, k, req.swiglu_limit)
        e, b = out[valid], bound[valid].to(torch.float32)
        g = got32[idx][valid]
        err = (g - e).abs()
        w = _clean_worst(e, g, b, err)
        if w is None:
            return False
        elements, worst = elements + err.numel(), max(worst, w)
        i0 = i1
    check.add_clean(elements, worst)
    return True


# ---- activation quantization ------------------------------------------------------------------------
def _normalized(req: ActQuantRequest) -> torch.Tensor:
    x = req.x.to(torch.float32)
    if req.rms_weight is None:
        return x
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + req.rms_eps) * req.rms_weight.to(torch.float32)


def _e4m3_round(v: torch.Tensor) -> torch.Tensor:
    return e4m3_decode(e4m3_encode(v.clamp(max=448.0)))


def _e2m1_round(v: torch.Tensor) -> torch.Tensor:
    return decode_codes_unchecked(e2m1_encode(v))   # codes 0..15 by construction


def audit_quant(req: ActQuantRequest, got: FP4Operand) -> CallCheck:
    """Judged step by step on the kernel's own earlier results: its global scale, then its block scales
    given that global scale, then its codes given those scales (so one flipped scale is one violation,
    not sixteen)."""
    check = CallCheck("quantize_activation")
    y = _normalized(req)
    m, k = y.shape
    if got.k != k or tuple(got.packed.shape) != (m, k // 2):
        check.add(["codes.shape"], torch.tensor([float(k)]), torch.tensor([float(got.k)]), torch.zeros(1),
                  torch.ones(1, dtype=torch.bool), torch.full((1,), float("inf")))
        return check
    delta = 0.0 if req.rms_weight is None else rmsnorm_delta(k) + 2 * U32
    g_k = got.global_scale.to(torch.float32).reshape(())
    # with a fused norm the step-by-step judgement's expected values are the exact-recipe roundings
    if _bit_identical(req, y, got, g_k, m, k, req.recipe if delta == 0 else "exact"):
        check.elements += 1 + m * (k // 16) + m * k     # what the step-by-step path counts, all clean
        return check
    if req.global_scale is not None:
        g_o = req.global_scale.to(torch.float32).reshape(())
        _compare(check, ["global_scale"], g_o.reshape(1), g_k.reshape(1), torch.zeros(1))
    else:
        g_o = nvfp4_runtime_global_scale(y)
        _compare(check, ["global_scale"], g_o.reshape(1), g_k.reshape(1), (delta * g_o.abs()).reshape(1))
    if not bool(torch.isfinite(g_k)) or float(g_k) <= 0:
        return check          # nothing below can be judged on a broken global scale
    s_k = e4m3_decode(linear_scales(got, rows=m).reshape(m, k // 16))
    codes_k = decode_codes_unchecked(unpack_nibbles(got.packed)).reshape(m, k)   # nibbles: 0..15 by construction
    if delta == 0:
        _, s_o_t, _ = nvfp4_quantize(y, g_k, recipe=req.recipe)
        _compare(check, ["scales", "row ", "block "], e4m3_decode(s_o_t), s_k, torch.zeros_like(s_k))
        p_o, _, _ = nvfp4_quantize(y, g_k, block_scale=linear_scales(got, rows=m).reshape(m, k // 16),
                                   recipe=req.recipe)
        codes_o = decode_codes_unchecked(unpack_nibbles(p_o)).reshape(m, k)
        _compare(check, ["codes", "row ", "k "], codes_o, codes_k, torch.zeros_like(codes_k))
        return check
    blocks = y.reshape(m, k // 16, 16)
    sf = blocks.abs().amax(dim=-1) / (g_k * 6.0)
    lo, hi = monotone_interval(sf, delta, _e4m3_round)
    _interval(check, ["scales", "row ", "block "], e4m3_decode(e4m3_encode(sf.clamp(max=448.0))), s_k, lo, hi)
    denom = (s_k * g_k).unsqueeze(-1)
    v = (blocks / denom).reshape(m, k)
    lo, hi = monotone_interval(v, delta, _e2m1_round)
    zero = (s_k == 0).repeat_interleave(16, dim=1)
    lo, hi = torch.where(zero, 0.0, lo), torch.where(zero, 0.0, hi)
    _interval(check, ["codes", "row ", "k "], torch.where(zero, 0.0, _e2m1_round(v)), codes_k, lo, hi)
    return check


def _bit_identical(req: ActQuantRequest, y: torch.Tensor, got: FP4Operand, g_k: torch.Tensor, m: int,
                   k: int, recipe: str) -> bool:
    """When the kernel's (finite, positive) global scale, block-scale bytes and code bytes all equal the
    oracle's, the step-by-step judgement below finds nothing: without a fused norm it requires exactly
    these bytes; with one, the oracle's own roundings lie inside every interval it allows (rounding is
    monotone) and the global scale inside its bound. Same verdict, one host read instead of five or
    more. Any difference, -0 vs +0 included, takes the step-by-step path."""
    g_o = req.global_scale.to(torch.float32).reshape(()) if req.global_scale is not None \
        else nvfp4_runtime_global_scale(y)
    p_o, s_o, _ = nvfp4_quantize(y, g_k, recipe=recipe)
    s_k = linear_scales(got, rows=m).reshape(m, k // 16)
    same = torch.stack([(g_o == g_k) & (g_k > 0) & torch.isfinite(g_k),
                        (p_o == got.packed).all(),
                        (s_o.view(torch.uint8) == s_k.view(torch.uint8)).all()])
    return bool(same.all())


def _interval(check: CallCheck, where: list[str], expected: torch.Tensor, got: torch.Tensor, lo: torch.Tensor,
              hi: torch.Tensor) -> None:
    """``got`` must lie in ``[lo, hi]`` (the values a boundary-near pre-rounding value may round to)."""
    nan = torch.isnan(expected) & torch.isnan(got)
    ok = nan | ((got >= lo) & (got <= hi))
    width = (hi - lo).abs().to(torch.float64)
    err = (got - expected).abs().to(torch.float64)
    ratio = torch.where(ok, torch.where(width > 0, err / width.clamp(min=1e-300), 0.0), float("inf"))
    check.add(where, expected.to(torch.float64), got.to(torch.float64), width, ~ok, ratio)


def audit_request(op: str, request: Any, output: Any) -> CallCheck:
    """Dispatch on the op name of a :class:`dsv4.layers.dispatch.KernelCall`."""
    if op == "gemm":
        return audit_gemm(request, output)
    if op == "grouped_gemm":
        return audit_grouped(request, output)
    if op == "quantize_activation":
        return audit_quant(request, output)
    raise ValueError(f"audit: op expected one of {OPS}, found {op!r}")
