"""The kernel contract: request objects every NVFP4 backend takes, validated before any launch.

An FP4 operand is packed uint8 ``[rows, K/2]`` (element 2k in the low nibble), float8_e4m3fn block
scales, one per 16 elements along K (``linear`` ``[rows, K/16]`` or the Blackwell 32_4_4
``swizzled`` flat layout of ``round_up(rows,128) * round_up(K/16,4)`` bytes), and FP32 global
(dequantization) scales. GEMMs compute ``y = alpha * sum_k a_q[m,k] * b_q[n,k]`` with FP32
accumulation, ``alpha = a.global * b.global`` applied in FP32 after the product, and return BF16.

The ``emulated`` backend is the executable definition of this contract. Spec: nvfp4-and-kernels.md
§3, §6, §8; docs/audit.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

FP4_BLOCK = 16
SCALE_LAYOUTS = ("linear", "swizzled")
RECIPES = ("exact", "rcp")        # division recipes of dsv4.numerics.nvfp4_quantize
MIN_GLOBAL_SCALE = 2.0 ** -126    # smaller static scales are misread checkpoints (e.g. 1.6e-43)


class KernelContractError(ValueError):
    """A tensor handed to a kernel does not satisfy the contract; raised before any launch."""


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def swizzled_numel(rows: int, scale_cols: int) -> int:
    return round_up(rows, 128) * round_up(scale_cols, 4)


def _fail(what: str, expected: str, found: object) -> None:
    raise KernelContractError(f"{what}: expected {expected}, found {found}")


@dataclass(frozen=True)
class FP4Operand:
    """One NVFP4 matrix ``[rows, k]``. ``global_scale`` is a 0-d FP32 tensor for a single matrix or
    ``[E]`` for a stack of E expert matrices (rows = E * rows_per_expert)."""

    packed: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    k: int
    scale_layout: str = "linear"

    @property
    def rows(self) -> int:
        return int(self.packed.shape[0])

    @property
    def device(self) -> torch.device:
        return self.packed.device

    def validate(self, name: str, *, groups: int | None = None) -> None:
        """Check dtypes, shapes, contiguity, devices and the exact numel of the scale tensor."""
        p, s, g = self.packed, self.scales, self.global_scale
        if not isinstance(self.k, int) or self.k <= 0 or self.k % FP4_BLOCK:
            _fail(f"{name}.k", f"a positive multiple of {FP4_BLOCK}", self.k)
        if p.dtype != torch.uint8:
            _fail(f"{name}.packed dtype", "torch.uint8", p.dtype)
        if p.dim() != 2 or p.shape[1] != self.k // 2:
            _fail(f"{name}.packed shape", f"[rows, {self.k // 2}]", tuple(p.shape))
        if not p.is_contiguous():
            _fail(f"{name}.packed", "a contiguous tensor", "a strided view")
        if s.dtype != torch.float8_e4m3fn:
            _fail(f"{name}.scales dtype", "torch.float8_e4m3fn", s.dtype)
        if self.scale_layout not in SCALE_LAYOUTS:
            _fail(f"{name}.scale_layout", f"one of {SCALE_LAYOUTS}", repr(self.scale_layout))
        sc = self.k // FP4_BLOCK
        if self.scale_layout == "linear":
            if tuple(s.shape) != (self.rows, sc):
                _fail(f"{name}.scales shape (linear)", f"[{self.rows}, {sc}]", tuple(s.shape))
        else:
            per = self.rows // (groups or 1)
            want = swizzled_numel(per, sc) * (groups or 1)
            if s.dim() != 1 or s.numel() != want:
                _fail(f"{name}.scales numel (swizzled)", f"{want} (= round_up({per},128) * round_up({sc},4)"
                      f"{' * ' + str(groups) + ' groups' if groups else ''}), 1-d", f"{s.numel()} {tuple(s.shape)}")
            if sc % 4 and not capturing():
                _check_column_padding(name, s, per, sc, groups or 1)
        if not s.is_contiguous():
            _fail(f"{name}.scales", "a contiguous tensor", "a strided view")
        if g.dtype != torch.float32:
            _fail(f"{name}.global_scale dtype", "torch.float32", g.dtype)
        want_g = () if groups is None else (groups,)
        if tuple(g.shape) != want_g:
            _fail(f"{name}.global_scale shape", str(list(want_g)), list(g.shape))
        for t, tn in ((s, "scales"), (g, "global_scale")):
            if t.device != p.device:
                _fail(f"{name}.{tn} device", f"{p.device} (same as packed)", t.device)


_PAD_MASKS: dict[tuple[int, int], torch.Tensor] = {}


def _column_padding_mask(rows: int, sc: int) -> torch.Tensor:
    """Flat positions of the swizzled layout that pad K/16 = ``sc`` up to a multiple of 4 in real rows."""
    key = (rows, sc)
    if key not in _PAD_MASKS:
        from ..numerics.swizzle import swizzle_scales

        m = torch.zeros(rows, round_up(sc, 4), dtype=torch.uint8)
        m[:, sc:] = 1
        _PAD_MASKS[key] = swizzle_scales(m).bool()
    return _PAD_MASKS[key]


def _check_column_padding(name: str, s: torch.Tensor, per: int, sc: int, groups: int) -> None:
    """Swizzled scales whose K/16 is not a multiple of 4 pad the last 4-column K tile; a block-scaled MMA
    multiplies those scales into that tile (its data past K is zero-filled), so they must be zeros (a NaN
    byte there, 0x7F, makes 0 x NaN). One host read, only for such K and outside a graph capture."""
    mask = _column_padding_mask(per, sc).to(s.device)
    pad = s.view(torch.uint8).reshape(groups, -1)[:, mask] & 0x7F     # -0 (0x80) is a zero too
    bad = int(torch.count_nonzero(pad))
    if bad:
        _fail(f"{name}.scales padding (swizzled, K/16 = {sc} padded to {round_up(sc, 4)} columns)",
              "zeros (a block-scaled MMA multiplies them into the last K tile)", f"{bad} non-zero byte(s)")


def _check_swiglu(limit: float | None, n: int, name: str) -> None:
    if limit is None:
        return
    if not (isinstance(limit, (int, float)) and limit > 0):
        _fail(f"{name}.swiglu_limit", "a positive float or None", limit)
    if n % 2:
        _fail(f"{name}: fused SwiGLU weight rows", "an even count ([gate; up] stacked)", n)


@dataclass(frozen=True)
class GemmRequest:
    """Dense ``y[M, N] = alpha * a[M, K] @ b[N, K]^T``. With ``swiglu_limit`` set, ``b`` holds
    ``[gate (N/2 rows); up (N/2 rows)]`` and the output is ``[M, N/2]``:
    ``silu(min(gate, L)) * clamp(up, -L, L)`` (the sigmoid reads the CLAMPED gate)."""

    a: FP4Operand
    b: FP4Operand
    swiglu_limit: float | None = None

    @property
    def out_shape(self) -> tuple[int, int]:
        n = self.b.rows // 2 if self.swiglu_limit is not None else self.b.rows
        return self.a.rows, n

    def validate(self) -> None:
        self.a.validate("a")
        self.b.validate("b")
        if self.a.k != self.b.k:
            _fail("GEMM K", f"a.k == b.k ({self.a.k})", self.b.k)
        if self.a.device != self.b.device:
            _fail("b device", f"{self.a.device} (same as a)", self.b.device)
        _check_swiglu(self.swiglu_limit, self.b.rows, "GemmRequest")


@dataclass(frozen=True)
class GroupedGemmRequest:
    """MoE grouped GEMM. ``a`` holds the rows of every expert back to back (expert e owns rows
    ``offsets[e]:offsets[e+1]``; groups may be empty), one global scale. ``b`` stacks E weight
    matrices of ``n_per_expert`` rows each with per-expert global scales ``[E]``; ``alphas[e] =
    a.global_scale * b.global_scale[e]`` (FP32, ``[E]``). ``offsets`` is int32 ``[E + 1]``,
    non-decreasing, from 0 to ``a.rows``. Swizzled ``b`` scales are swizzled per expert."""

    a: FP4Operand
    b: FP4Operand
    offsets: torch.Tensor
    alphas: torch.Tensor
    swiglu_limit: float | None = None

    @property
    def num_experts(self) -> int:
        return int(self.offsets.numel()) - 1

    @property
    def n_per_expert(self) -> int:
        return self.b.rows // max(self.num_experts, 1)

    @property
    def out_shape(self) -> tuple[int, int]:
        n = self.n_per_expert
        return self.a.rows, (n // 2 if self.swiglu_limit is not None else n)

    def validate(self, check_values: bool = True) -> None:
        """``check_values=False`` skips the checks that read device memory on the host (offsets,
        alphas): callers that already validated the same tensors, e.g. inside CUDA-graph capture."""
        o = self.offsets
        if o.dtype != torch.int32 or o.dim() != 1 or o.numel() < 2:
            _fail("offsets", "int32 [E + 1] with E >= 1", f"{o.dtype} {tuple(o.shape)}")
        e = self.num_experts
        self.a.validate("a")
        if self.b.rows % e:
            _fail("b rows", f"a multiple of the expert count {e}", self.b.rows)
        self.b.validate("b", groups=e)
        if self.a.k != self.b.k:
            _fail("grouped GEMM K", f"a.k == b.k ({self.a.k})", self.b.k)
        for t, tn in ((o, "offsets"), (self.alphas, "alphas"), (self.b.packed, "b")):
            if t.device != self.a.device:
                _fail(f"{tn} device", f"{self.a.device} (same as a)", t.device)
        if self.alphas.dtype != torch.float32 or tuple(self.alphas.shape) != (e,):
            _fail("alphas", f"float32 [{e}]", f"{self.alphas.dtype} {tuple(self.alphas.shape)}")
        _check_swiglu(self.swiglu_limit, self.n_per_expert, "GroupedGemmRequest")
        if not check_values:
            return
        oc = o.to("cpu")  # one small host read, before launch, to reject bad offsets
        if int(oc[0]) != 0 or int(oc[-1]) != self.a.rows or bool((oc[1:] < oc[:-1]).any()):
            _fail("offsets", f"non-decreasing from 0 to a.rows={self.a.rows}", oc.tolist())
        # alphas duplicate the global scales for the kernels' convenience: they must agree exactly
        want = self.a.global_scale * self.b.global_scale
        if not torch.equal(self.alphas, want):
            _fail("alphas", "a.global_scale * b.global_scale (fp32, per expert)",
                  f"{self.alphas.tolist()} vs {want.tolist()}")


@dataclass(frozen=True)
class ActQuantRequest:
    """BF16 activations ``x [M, K]`` -> an FP4Operand. ``global_scale``: a static 0-d FP32
    dequantization scale (e.g. the checkpoint's ``input_scale``), or None for the runtime amax
    (``amax(|x|) / (6 * 448)``, computed after the optional RMSNorm). ``rms_weight`` fuses an RMSNorm
    (``x * rsqrt(mean(x^2) + eps) * w``, in FP32) before quantization. ``recipe`` names the division
    recipe of ``dsv4.numerics.nvfp4_quantize`` the codes must match exactly — except with a fused
    RMSNorm, whose rsqrt and reduction order differ between backends: there rare +-1-code
    differences are expected and kernel tests allow them."""

    x: torch.Tensor
    global_scale: torch.Tensor | None = None
    rms_weight: torch.Tensor | None = None
    rms_eps: float = 1e-6
    scale_layout: str = "linear"
    recipe: str = "exact"

    def validate(self, check_values: bool = True) -> None:
        """``check_values=False`` skips the host read of a static global scale (CUDA-graph capture)."""
        x = self.x
        if x.dtype != torch.bfloat16:
            _fail("x dtype", "torch.bfloat16", x.dtype)
        if x.dim() != 2 or x.shape[1] % FP4_BLOCK or x.shape[1] == 0:
            _fail("x shape", f"[M, K] with K a positive multiple of {FP4_BLOCK}", tuple(x.shape))
        if not x.is_contiguous():
            _fail("x", "a contiguous tensor", "a strided view")
        if self.scale_layout not in SCALE_LAYOUTS:
            _fail("scale_layout", f"one of {SCALE_LAYOUTS}", repr(self.scale_layout))
        if self.recipe not in RECIPES:
            _fail("recipe", f"one of {RECIPES}", repr(self.recipe))
        g = self.global_scale
        if g is not None and (g.dtype != torch.float32 or g.dim() != 0 or g.device != x.device):
            _fail("global_scale", f"a 0-d float32 tensor on {x.device}", f"{g.dtype} {tuple(g.shape)} {g.device}")
        w = self.rms_weight
        if w is not None and (tuple(w.shape) != (x.shape[1],) or w.device != x.device or not w.is_floating_point()):
            _fail("rms_weight", f"a float [{x.shape[1]}] tensor on {x.device}",
                  f"{w.dtype} {tuple(w.shape)} on {w.device}")
        if not (isinstance(self.rms_eps, (int, float)) and self.rms_eps > 0):
            _fail("rms_eps", "a positive float", self.rms_eps)
        if g is not None and check_values:
            gv = float(g)   # one host read: a misread static scale must fail before launch
            if not (gv >= MIN_GLOBAL_SCALE and gv < float("inf")):
                _fail("global_scale value", "finite and >= 2^-126", gv)


class Backend(Protocol):
    """What every NVFP4 backend provides. Implementations validate requests before launching.
    ``check_values=False`` may be passed to the two methods whose validation reads device memory
    on the host (offsets, alphas, a static global scale): callers do so inside CUDA-graph capture,
    for tensors validated before; kernel backends also skip those reads on their own while capturing."""

    name: str

    def gemm(self, req: GemmRequest) -> torch.Tensor: ...

    def grouped_gemm(self, req: GroupedGemmRequest, *, check_values: bool = True) -> torch.Tensor: ...

    def quantize_activation(self, req: ActQuantRequest, *, check_values: bool = True) -> FP4Operand: ...


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False on CPU-only torch): the contract's
    host reads are skipped then, and nothing a call returns has been computed yet."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
