"""CPU tier of the CuTe DSL host side: validation happens before any launch, the edge scale swizzle
matches the oracle, the tile heuristics never produce an empty split or too few grouped slots, the
compiled-kernel cache compiles once per shape class, and registration degrades without the extra."""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.kernels.contract import (ActQuantRequest, FP4Operand, GemmRequest, GroupedGemmRequest,
                                   KernelContractError)
from dsv4.kernels.cutedsl.common import KernelCache, check_align, swizzle_linear_scales
from dsv4.numerics import swizzle_scales, to_float8_e4m3fn

HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass-dsl (extra 'cutedsl') is not installed")


def _op(rows: int, k: int, *, device: str = "cpu", groups: int | None = None, layout: str = "linear") -> FP4Operand:
    packed = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device=device)
    scales = to_float8_e4m3fn(torch.rand(rows, k // 16) * 4).to(device)
    if layout == "swizzled":
        scales = swizzle_linear_scales(scales, groups or 1)
    g = torch.ones(groups, device=device) if groups else torch.tensor(1.0, device=device)
    return FP4Operand(packed, scales, g, k=k, scale_layout=layout)


class _NoLaunch:
    """Stands in for the compile cache: any attempt to compile / launch fails the test."""

    def get(self, key, build):
        raise AssertionError(f"a kernel was compiled/launched for {key} despite invalid input")


@pytest.fixture()
def backend():
    if not HAS_CUTLASS:
        pytest.skip("nvidia-cutlass-dsl (extra 'cutedsl') is not installed")
    from dsv4.kernels.cutedsl.sm90 import Sm90Backend

    b = Sm90Backend("cpu")
    b._gemms = _NoLaunch()
    b._num_sms = 132
    return b


# ----------------------------------------------------------------------------- validation
@needs_cutlass
def test_gemm_rejects_wrong_scale_numel_before_launch(backend):
    a, b = _op(4, 64), _op(8, 64)
    bad = FP4Operand(b.packed, b.scales[:-1], b.global_scale, k=64)  # one row of scales short
    with pytest.raises(KernelContractError, match=r"b\.scales shape"):
        backend.gemm(GemmRequest(a, bad))
    swz = _op(8, 64, layout="swizzled")
    short = FP4Operand(swz.packed, swz.scales[:-4], swz.global_scale, k=64, scale_layout="swizzled")
    with pytest.raises(KernelContractError, match=r"numel \(swizzled\).*expected 512"):
        backend.gemm(GemmRequest(a, short))


@needs_cutlass
def test_gemm_rejects_wrong_dtype_and_strided_operands(backend):
    a, b = _op(4, 64), _op(8, 64)
    with pytest.raises(KernelContractError, match="packed dtype"):
        backend.gemm(GemmRequest(FP4Operand(a.packed.to(torch.int8), a.scales, a.global_scale, k=64), b))
    wide = torch.randint(0, 256, (4, 64), dtype=torch.uint8)
    with pytest.raises(KernelContractError, match="contiguous"):
        backend.gemm(GemmRequest(FP4Operand(wide[:, ::2], a.scales, a.global_scale, k=64), b))


@needs_cutlass
def test_gemm_rejects_cpu_tensors_before_launch(backend):
    with pytest.raises(KernelContractError, match="a.packed device: expected a CUDA tensor"):
        backend.gemm(GemmRequest(_op(4, 64), _op(8, 64)))


@needs_cutlass
def test_grouped_gemm_rejects_bad_offsets_before_launch(backend):
    a, b = _op(6, 64), _op(3 * 8, 64, groups=3)
    alphas = torch.ones(3)
    for offs, msg in (([0, 2, 1, 6], "non-decreasing"), ([0, 2, 4, 5], "non-decreasing from 0 to a.rows=6"),
                      ([1, 2, 4, 6], "non-decreasing")):
        with pytest.raises(KernelContractError, match=msg):
            backend.grouped_gemm(GroupedGemmRequest(a, b, torch.tensor(offs, dtype=torch.int32), alphas))
    with pytest.raises(KernelContractError, match="offsets"):
        backend.grouped_gemm(GroupedGemmRequest(a, b, torch.tensor([0, 2, 4, 6]), alphas))  # int64
    with pytest.raises(KernelContractError, match=r"alphas"):
        backend.grouped_gemm(GroupedGemmRequest(a, b, torch.tensor([0, 2, 4, 6], dtype=torch.int32), torch.ones(2)))


@needs_cutlass
def test_grouped_gemm_rejects_per_expert_swizzled_numel(backend):
    a = _op(6, 64)
    b = _op(3 * 8, 64, groups=3, layout="swizzled")
    short = FP4Operand(b.packed, b.scales[:512 * 2], b.global_scale, k=64, scale_layout="swizzled")
    with pytest.raises(KernelContractError, match=r"3 groups"):
        backend.grouped_gemm(GroupedGemmRequest(a, short, torch.tensor([0, 2, 4, 6], dtype=torch.int32),
                                                torch.ones(3)))


def test_alignment_check_names_expected_and_found():
    buf = torch.zeros(64, dtype=torch.uint8)
    check_align(buf, "x", 16)
    with pytest.raises(KernelContractError, match=r"x data pointer: expected 16-byte aligned, found address % 16 = 1"):
        check_align(buf[1:], "x", 16)


@needs_cutlass
def test_act_quant_rejects_bad_requests_before_launch(backend):
    x = torch.randn(4, 64).to(torch.bfloat16)
    with pytest.raises(KernelContractError, match="x dtype"):
        backend.quantize_activation(ActQuantRequest(x.float()))
    with pytest.raises(KernelContractError, match="recipe"):
        backend.quantize_activation(ActQuantRequest(x, recipe="fast"))
    with pytest.raises(KernelContractError, match="contiguous"):
        backend.quantize_activation(ActQuantRequest(torch.randn(64, 4).to(torch.bfloat16).T))
    with pytest.raises(KernelContractError, match="x device: expected a CUDA tensor"):
        backend.quantize_activation(ActQuantRequest(x))


# ----------------------------------------------------------------------------- edge swizzle
@given(rows=st.integers(1, 300), cols=st.integers(1, 40), groups=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_edge_swizzle_matches_oracle_per_group(rows, cols, groups):
    s = to_float8_e4m3fn(torch.rand(groups * rows, cols) * 448)
    mine = swizzle_linear_scales(s, groups).view(torch.uint8)
    ref = swizzle_scales(s.view(torch.uint8).reshape(groups, rows, cols)).reshape(-1)
    assert torch.equal(mine, ref)


# ----------------------------------------------------------------------------- tile heuristics
@needs_cutlass
@given(m=st.integers(1, 5000), n=st.sampled_from([64, 96, 1536, 3072, 6144, 7168]),
       k=st.sampled_from([16, 48, 64, 1024, 3072, 7168]), swiglu=st.booleans())
@settings(max_examples=60, deadline=None)
def test_dense_launch_covers_output_and_never_has_empty_splits(m, n, k, swiglu):
    from dsv4.kernels.cutedsl.sm90.configs import dense_launch

    L = dense_launch(m, n, k, swiglu=swiglu, num_sms=132)
    cfg = L.cfg
    n_cols = n // 2 if swiglu else n
    assert L.grid_x * cfg.token_tile >= m and (L.grid_x - 1) * cfg.token_tile < m
    assert L.grid_y * cfg.col_tile >= n_cols
    k_tiles = -(-k // cfg.bk)
    per = -(-k_tiles // L.splits)
    assert (L.splits - 1) * per < k_tiles  # the last split owns at least one k-tile
    assert L.splits == 1 or cfg.split
    assert cfg.vec_bytes == (16 if k % 32 == 0 else 8)
    assert (m <= 64) == cfg.swap


@needs_cutlass
@given(counts=st.lists(st.integers(0, 300), min_size=1, max_size=64), swiglu=st.booleans())
@settings(max_examples=60, deadline=None)
def test_grouped_slot_bound_covers_every_token_tile(counts, swiglu):
    """The device schedules sum_e ceil(m_e / tile) tiles; grid.x must never be smaller."""
    from dsv4.kernels.cutedsl.sm90.configs import grouped_launch

    m = sum(counts)
    L = grouped_launch(m, len(counts), 256, 1024, swiglu=swiglu, num_sms=132)
    tt = L.cfg.token_tile
    assert L.grid_x >= sum(-(-c // tt) for c in counts)


@needs_cutlass
def test_decode_shapes_use_swap_and_split_k():
    from dsv4.kernels.cutedsl.sm90.configs import dense_launch, grouped_launch

    L = dense_launch(1, 3072, 7168, swiglu=False, num_sms=132)
    assert L.cfg.swap and L.cfg.q_tile == 8 and L.grid_y == 48 and L.splits >= 4
    G = grouped_launch(6, 384, 6144, 7168, swiglu=True, num_sms=132)
    assert G.cfg.swap and G.cfg.grouped and G.grid_x == 6 and G.grid_y == 96  # 576 CTAs: no split needed
    P = dense_launch(4096, 3072, 7168, swiglu=False, num_sms=132)
    assert not P.cfg.swap and P.splits == 1 and P.grid_x == 32 and P.grid_y == 24


# ----------------------------------------------------------------------------- cache, registry
def test_kernel_cache_builds_once_per_key():
    cache, calls = KernelCache(), []
    for key in ("a", "b", "a", "a", "b"):
        cache.get(key, lambda key=key: calls.append(key) or key.upper())
    assert calls == ["a", "b"] and cache.compiles == 2 and len(cache) == 2


def test_cutedsl_backends_are_registered_with_a_reason_when_not_executable():
    from dsv4.kernels.registry import BackendError, available_backends, get_backend

    infos = available_backends()
    assert {"cutedsl_sm90", "cutedsl_sm100"} <= set(infos)
    for name in ("cutedsl_sm90", "cutedsl_sm100"):
        assert not infos[name].supports(torch.device("cpu"))
        assert infos[name].priority == 10
    if not torch.cuda.is_available():
        assert infos["cutedsl_sm90"].note in ("compiled, not executed here",) or "unavailable" in infos["cutedsl_sm90"].note
        with pytest.raises(BackendError, match="cannot execute on device cpu"):
            get_backend("cutedsl_sm90", "cpu")
        assert get_backend("auto", "cpu").name == "emulated"


def test_registration_survives_a_missing_cutlass(monkeypatch):
    from dsv4.kernels import registry
    from dsv4.kernels.cutedsl import register

    monkeypatch.setitem(sys.modules, "cutlass", None)  # `import cutlass` now raises ImportError
    saved = dict(registry._REGISTRY)
    try:
        register.register()
        info = registry._REGISTRY["cutedsl_sm90"]
        assert "nvidia-cutlass-dsl unavailable" in info.note and not info.supports(torch.device("cuda"))
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
