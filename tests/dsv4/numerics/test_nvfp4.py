"""NVFP4 quantize/dequantize: exhaustive round trips, recipe definitions, properties over shapes and
value distributions, NaN/Inf behaviour and edge validation (spec nvfp4-and-kernels.md §3, §6)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4.numerics import (e2m1_decode, e4m3_decode, nvfp4_dequantize, nvfp4_quantize, swizzle_scales,
                           unpack_nibbles)

CODES = torch.arange(16, dtype=torch.uint8)
VALS = e2m1_decode(CODES)
POS_SCALES = e4m3_decode(torch.arange(1, 0x7F, dtype=torch.int32).to(torch.uint8))  # 126 finite > 0
MAGS64 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def codes_of(packed: torch.Tensor) -> torch.Tensor:
    return unpack_nibbles(packed)


def signed_index(codes: torch.Tensor) -> torch.Tensor:
    """Position on the E2M1 grid, -7..7 (+0 and -0 both 0), so neighbouring values differ by 1."""
    c = codes.to(torch.int32)
    return torch.where(c >= 8, -(c & 7), c & 7)


def ref_codes(v: torch.Tensor) -> torch.Tensor:
    """Brute-force RNE onto the E2M1 grid by distance (independent of the library's bounds)."""
    a = v.double().abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - MAGS64).abs()
    best = d.min(dim=-1, keepdim=True).values
    cand = d == best
    even = cand & (torch.arange(8) % 2 == 0)
    mag = torch.where(even.any(-1), even.to(torch.int8).argmax(-1), cand.to(torch.int8).argmax(-1))
    return (mag | (torch.signbit(v).long() << 3)).to(torch.uint8)


def ref_scale_inputs(x: torch.Tensor, g: torch.Tensor, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe's steps 1-2 written out in the test (float32 torch ops): (amax_b, sf)."""
    xb = x.float().reshape(*x.shape[:-1], -1, 16)
    amax = xb.abs().amax(-1)
    six_g = g * 6.0
    sf = amax / six_g if recipe == "exact" else amax * (torch.tensor(1.0) / six_g)
    return amax, sf


def ref_v(x: torch.Tensor, s: torch.Tensor, g: torch.Tensor, recipe: str) -> torch.Tensor:
    xb = x.float().reshape(*x.shape[:-1], -1, 16)
    d = (s * g).unsqueeze(-1)
    return xb / d if recipe == "exact" else xb * (torch.tensor(1.0) / d)


# ---------------------------------------------------------------- exhaustive round trips


@pytest.mark.parametrize("recipe", ["exact", "rcp"])
@pytest.mark.parametrize("g", [1.0, 2.0 ** -10, 0.3, 1.7e-3])
def test_every_code_with_every_finite_scale_round_trips(recipe: str, g: float) -> None:
    # Row i holds all 16 code values times d_i = fl(scale_i * g); the scale is forced.
    gt = torch.tensor(g)
    d = POS_SCALES * gt
    x = VALS.unsqueeze(0) * d.unsqueeze(1)  # [126, 16]
    packed, scales, g_out = nvfp4_quantize(x, gt, block_scale=POS_SCALES.unsqueeze(1).to(torch.float8_e4m3fn),
                                           recipe=recipe)
    assert torch.equal(codes_of(packed), CODES.expand(126, 16))  # -0.0 included: code 8 survives
    # dequantization is e2m1 * scale (exact) times g, rounded once
    want = ((VALS.double().unsqueeze(0) * POS_SCALES.double().unsqueeze(1)) * gt.double()).float()
    assert torch.equal(nvfp4_dequantize(packed, scales, g_out), want)
    if g in (1.0, 2.0 ** -10):  # power-of-two g: everything is exact, so dequant(quant(x)) == x
        assert torch.equal(nvfp4_dequantize(packed, scales, g_out), x)


@pytest.mark.parametrize("recipe", ["exact", "rcp"])
@pytest.mark.parametrize("g", [1.0, 2.0 ** -5])
def test_full_pipeline_recovers_every_scale_and_code(recipe: str, g: float) -> None:
    # Each block is all 16 codes times (scale * g): its amax is 6 * scale * g, so steps 1-3 must
    # recover the scale exactly (rcp is off by <= 1 fp32 ulp before the E4M3 rounding) and every code.
    x = VALS.unsqueeze(0) * (POS_SCALES * g).unsqueeze(1)
    packed, scales, _ = nvfp4_quantize(x, g, recipe=recipe)
    assert torch.equal(e4m3_decode(scales.view(torch.uint8)).squeeze(1), POS_SCALES)
    assert torch.equal(codes_of(packed), CODES.expand(126, 16))
    assert torch.equal(nvfp4_dequantize(packed, scales, g), x)


def test_zero_scale_forces_zero_codes() -> None:
    x = VALS.unsqueeze(0).repeat(2, 1)
    packed, _, _ = nvfp4_quantize(x, 1.0, block_scale=torch.zeros(2, 1, dtype=torch.float8_e4m3fn))
    assert codes_of(packed).eq(0).all()
    # a block whose sf rounds to 0 in E4M3 (sf <= 2^-10) also gets zero codes
    tiny = torch.full((1, 16), 6 * 2.0 ** -11)
    packed, scales, _ = nvfp4_quantize(tiny, 1.0)
    assert scales.view(torch.uint8).item() == 0 and codes_of(packed).eq(0).all()


@pytest.mark.parametrize("recipe", ["exact", "rcp"])
def test_ties_round_to_even_through_the_quantizer(recipe: str) -> None:
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x = torch.cat([ties, -ties]).unsqueeze(0)  # amax 6 -> scale 1 with g = 1, so v = x exactly
    packed, scales, _ = nvfp4_quantize(x, 1.0, recipe=recipe)
    assert e4m3_decode(scales.view(torch.uint8)).item() == 1.0
    assert codes_of(packed)[0].tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 10, 10, 12, 12, 14, 14, 15]


def test_scale_saturates_at_448_and_codes_at_6() -> None:
    x = torch.full((1, 16), 1e6)
    x[0, 1] = -3e6
    packed, scales, _ = nvfp4_quantize(x, 1.0)
    assert scales.view(torch.uint8).item() == 0x7E
    assert codes_of(packed)[0, :2].tolist() == [7, 15]


# ---------------------------------------------------------------- recipes


def test_recipes_differ_only_by_one_code_and_do_differ_somewhere() -> None:
    # Sweep many global scales over blocks that put v exactly on the 0.75 and 1.75 ties: the exact
    # recipe lands on the tie, rcp (x * fl(1/d)) can fall an ulp below it -> one code lower.
    gen = torch.Generator().manual_seed(3)
    gs = torch.rand(400, generator=gen) * 0.9 + 0.1
    diffs = 0
    for g in gs:
        d = torch.tensor(1.0) * g  # scale 1.0 (forced), d = fl(1 * g)
        x = (torch.tensor([6.0, 0.75, 1.75, 2.5, -0.75, 3.5, 0.25, 1.25] * 2) * d).unsqueeze(0)
        bs = torch.ones(1, 1).to(torch.float8_e4m3fn)
        ce = signed_index(codes_of(nvfp4_quantize(x, g, block_scale=bs, recipe="exact")[0]))
        cr = signed_index(codes_of(nvfp4_quantize(x, g, block_scale=bs, recipe="rcp")[0]))
        assert (ce - cr).abs().max() <= 1
        diffs += int((ce != cr).sum())
    assert diffs > 0  # the recipes are really different functions


def test_scale_step_recipes_differ_on_e4m3_ties() -> None:
    # Blocks whose amax / (6g) sits on an E4M3 tie (1.0625, between 1.0 and 1.125): the exact
    # division lands on or next to the tie, amax * fl(1/(6g)) can land on its other side. Each
    # recipe must match its own definition (checked against torch's E4M3 cast), and they must differ.
    gen = torch.Generator().manual_seed(9)
    gs = (torch.rand(2000, generator=gen) * 0.9 + 0.1).float()
    six_g = gs * 6.0
    amax = 1.0625 * six_g
    x = torch.zeros(2000, 16)
    x[:, 0] = amax
    for_recipe = {}
    for recipe in ("exact", "rcp"):
        scales = torch.stack([nvfp4_quantize(x[i:i + 1], gs[i], recipe=recipe)[1][0, 0] for i in range(0, 2000, 8)])
        sf = amax[::8] / six_g[::8] if recipe == "exact" else amax[::8] * (torch.tensor(1.0) / six_g[::8])
        assert torch.equal(scales.view(torch.uint8), sf.to(torch.float8_e4m3fn).view(torch.uint8))
        for_recipe[recipe] = scales.view(torch.uint8).int()
    diffs = int((for_recipe["exact"] != for_recipe["rcp"]).sum())
    assert diffs > 0 and (for_recipe["exact"] - for_recipe["rcp"]).abs().max() == 1


def test_recipes_agree_on_random_float32_data() -> None:
    # Off ties the two recipes disagree only when an fp32 rounding straddles a decision bound:
    # probability ~2^-20 per element, so none in 1M values (measured: 0).
    x = torch.randn(256, 4096, generator=torch.Generator().manual_seed(1))
    pe, se, _ = nvfp4_quantize(x, recipe="exact")
    pr, sr, _ = nvfp4_quantize(x, recipe="rcp")
    assert torch.equal(se.view(torch.uint8), sr.view(torch.uint8))
    assert int((pe != pr).sum()) <= 2


# ---------------------------------------------------------------- properties (Hypothesis)

KINDS = ["normal", "wide", "block_wide", "zeros", "subnormal", "quarters"]


def make_x(lead: tuple[int, ...], k: int, kind: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (*lead, k)
    x = torch.randn(shape, generator=gen)
    if kind == "wide":  # per-element dynamic range of 2^80
        x = x * torch.exp2(torch.randint(-40, 40, shape, generator=gen).float())
    elif kind == "block_wide":  # whole blocks far below the global amax -> E4M3-subnormal / zero scales
        e = torch.randint(-60, 20, (*lead, k // 16, 1), generator=gen).float()
        x = (x.reshape(*lead, k // 16, 16) * torch.exp2(e)).reshape(shape)
    elif kind == "zeros":
        x = x * (torch.rand(shape, generator=gen) < 0.2)
        x.reshape(-1, 16)[::3] = 0.0  # some all-zero blocks
    elif kind == "subnormal":  # fp32 subnormals next to ordinary values
        x = x * torch.where(torch.rand(shape, generator=gen) < 0.5, torch.tensor(1e-40), torch.tensor(1.0))
    elif kind == "quarters":  # many exact ties of the E2M1 grid
        x = torch.randint(-24, 25, shape, generator=gen).float() / 4
    return x


@st.composite
def nvfp4_cases(draw: st.DrawFn) -> tuple[torch.Tensor, object, str]:
    lead = draw(st.sampled_from([(1,), (2,), (5,), (3, 2)]))
    k = 16 * draw(st.integers(1, 11))  # 16..176: includes K not a multiple of 64
    x = make_x(lead, k, draw(st.sampled_from(KINDS)), draw(st.integers(0, 2 ** 31 - 1)))
    if draw(st.booleans()):
        x = x.to(torch.bfloat16)
    mode = draw(st.sampled_from(["runtime", "static", "one", "at_limit"]))
    amax = float(x.float().abs().max())
    if mode == "runtime" or amax == 0 or amax < 2.0 ** -100:
        g = None
    elif mode == "one":
        g = 1.0
    elif mode == "at_limit":  # the largest block lands exactly on, or just past, sf = 448
        g = torch.tensor(amax) / 2688.0 * draw(st.sampled_from([1.0, 0.999999, 0.99]))
    else:
        g = torch.tensor(amax / 2688.0 * 2.0 ** draw(st.floats(-4, 4)))
    return x, g, draw(st.sampled_from(["exact", "rcp"]))


@settings(max_examples=120, deadline=None)
@given(nvfp4_cases())
def test_quantizer_follows_its_recipe_and_bounds_the_error(case: tuple[torch.Tensor, object, str]) -> None:
    x, g_in, recipe = case
    packed, scales, g = nvfp4_quantize(x, g_in, recipe=recipe)
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (*lead, k // 2)
    assert scales.dtype == torch.float8_e4m3fn and tuple(scales.shape) == (*lead, k // 16)
    assert g.dtype == torch.float32 and g.dim() == 0
    if g_in is None:
        want_g = max(float(x.float().abs().max() / torch.tensor(2688.0)), 2.0 ** -126)
        assert g.item() == want_g

    # step 3 agrees with torch's own E4M3 conversion of the clamped value
    amax, sf = ref_scale_inputs(x, g, recipe)
    assert torch.equal(scales.view(torch.uint8), sf.clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8))
    # steps 4-6 agree with a brute-force nearest-even search
    s = e4m3_decode(scales.view(torch.uint8))
    v = ref_v(x, s, g, recipe)
    want = torch.where(s.unsqueeze(-1) == 0, torch.zeros_like(v, dtype=torch.uint8), ref_codes(v))
    assert torch.equal(codes_of(packed), want.reshape(*lead, k))

    # error bound where the scale is an E4M3 normal and not clamped: half a grid step of v (the
    # scale's own rounding is <= 1/16, so v <= 6.4 and saturation costs < one step) + fp32 rounding
    deq = nvfp4_dequantize(packed, scales, g).reshape(v.shape).double()
    xb = x.double().reshape(v.shape)
    d = (s * g).double().unsqueeze(-1)
    half_gap = torch.where(v.abs() <= 2, 0.25, torch.where(v.abs() <= 4, 0.5, 1.0)).double()
    ok_block = ((s >= 2.0 ** -6) & (sf <= 448)).unsqueeze(-1)
    err = (deq - xb).abs()
    bound = d * half_gap * (1 + 2.0 ** -20) + 2.0 ** -22 * xb.abs()
    assert bool(((err <= bound) | ~ok_block).all())
    # zero-scale blocks were tiny: amax <= 6 * g * 2^-10 (sf rounded to E4M3 zero)
    tiny = (s == 0).unsqueeze(-1)
    assert bool(((xb.abs() <= 6 * float(g) * 2.0 ** -10 * (1 + 2.0 ** -20)) | ~tiny).all())


@settings(max_examples=60, deadline=None)
@given(nvfp4_cases())
def test_exact_and_rcp_recipes_differ_by_at_most_one_step(case: tuple[torch.Tensor, object, str]) -> None:
    x, g_in, _ = case
    pe, se, ge = nvfp4_quantize(x, g_in, recipe="exact")
    pr, sr, gr = nvfp4_quantize(x, g_in, recipe="rcp")
    assert torch.equal(ge, gr)  # the global scale does not depend on the recipe
    be, br = se.view(torch.uint8).int(), sr.view(torch.uint8).int()
    assert (be - br).abs().max() <= 1  # positive E4M3 bytes are monotone: one byte = one step
    same = (be == br).repeat_interleave(16, dim=-1)
    dc = (signed_index(codes_of(pe)) - signed_index(codes_of(pr))).abs()
    assert int(dc[same].max()) <= 1 if same.any() else True


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=-2.0 ** 120, max_value=2.0 ** 120, width=32), min_size=16, max_size=16),
       st.sampled_from(["exact", "rcp"]))
def test_arbitrary_float32_blocks(vals: list[float], recipe: str) -> None:
    # Hypothesis' float strategy hits 0, -0, subnormals, the fp32 max and powers of two directly.
    x = torch.tensor([vals], dtype=torch.float32)
    packed, scales, g = nvfp4_quantize(x, recipe=recipe)
    deq = nvfp4_dequantize(packed, scales, g)
    assert torch.isfinite(deq).all()
    amax = x.abs().max()
    # amax/g is 2688 up to rounding (or the 2^-126 floor), so the block scale is 448 or within a
    # rounding of it, and the largest element comes back within a quarter of its size (one step)
    if float(amax) > 2688 * 2.0 ** -126:
        assert e4m3_decode(scales.view(torch.uint8)).item() == 448.0
        assert abs(float(deq.abs().max()) - float(amax)) <= 0.17 * float(amax)


# ---------------------------------------------------------------- layouts, dtypes


def test_swizzled_scales_dequantize_like_linear() -> None:
    x = torch.randn(130, 96, generator=torch.Generator().manual_seed(5))
    packed, scales, g = nvfp4_quantize(x)
    lin = nvfp4_dequantize(packed, scales, g)
    assert torch.equal(nvfp4_dequantize(packed, swizzle_scales(scales), g, scale_layout="swizzled"), lin)


def test_equal_values_in_any_float_dtype_quantize_alike() -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    outs = [nvfp4_quantize(x.to(dt)) for dt in (torch.bfloat16, torch.float32, torch.float64)]
    for p, s, g in outs[1:]:
        assert torch.equal(p, outs[0][0]) and torch.equal(s.view(torch.uint8), outs[0][1].view(torch.uint8))
        assert torch.equal(g, outs[0][2])


def test_empty_and_all_zero_inputs() -> None:
    p, s, g = nvfp4_quantize(torch.zeros(0, 32))
    assert p.shape == (0, 16) and s.shape == (0, 2) and g.item() == 2.0 ** -126
    p, s, g = nvfp4_quantize(torch.zeros(3, 32))
    assert g.item() == 2.0 ** -126 and p.eq(0).all() and s.view(torch.uint8).eq(0).all()
    assert nvfp4_dequantize(p, s, g).eq(0).all()


# ---------------------------------------------------------------- NaN / Inf


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_with_static_scale_poisons_only_its_block(bad: float) -> None:
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(7))
    x[1, 20] = bad
    packed, scales, g = nvfp4_quantize(x, 0.01)
    b = scales.view(torch.uint8)
    assert b[1, 1].item() == 0x7F  # NaN scale for the block holding the bad value
    deq = nvfp4_dequantize(packed, scales, g)
    assert torch.isnan(deq[1, 16:32]).all()
    assert torch.isfinite(deq[0]).all() and torch.isfinite(deq[1, :16]).all() and torch.isfinite(deq[1, 32:]).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_with_runtime_scale_gives_nan_global(bad: float) -> None:
    x = torch.randn(2, 32)
    x[0, 3] = bad
    packed, scales, g = nvfp4_quantize(x)
    assert torch.isnan(g)
    assert torch.isnan(nvfp4_dequantize(packed, scales, g)).all()


# ---------------------------------------------------------------- edge validation


@pytest.mark.parametrize("g", [0.0, -1.0, float("nan"), float("inf"), 1.6e-43])
def test_invalid_static_global_scale_raises(g: float) -> None:
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_quantize(torch.randn(1, 16), g)


def test_global_scale_floor_is_accepted() -> None:
    nvfp4_quantize(torch.randn(1, 16), 2.0 ** -126)
    nvfp4_quantize(torch.randn(1, 16), torch.tensor(0.5))


def test_validation_messages() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4_quantize(torch.randn(2, 24))
    with pytest.raises(ValueError, match="dtype"):
        nvfp4_quantize(torch.ones(2, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="recipe"):
        nvfp4_quantize(torch.randn(2, 16), recipe="fast")
    with pytest.raises(ValueError, match="global_scale"):
        nvfp4_quantize(torch.randn(2, 16), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="block_scale shape"):
        nvfp4_quantize(torch.randn(2, 32), 1.0, block_scale=torch.ones(2, 1).to(torch.float8_e4m3fn))
    with pytest.raises(ValueError, match="block_scale dtype"):
        nvfp4_quantize(torch.randn(2, 16), 1.0, block_scale=torch.ones(2, 1))
    p, s, g = nvfp4_quantize(torch.randn(2, 32))
    with pytest.raises(ValueError, match="packed dtype"):
        nvfp4_dequantize(p.view(torch.int8), s, g)
    with pytest.raises(ValueError, match=r"scales \(linear\) shape"):
        nvfp4_dequantize(p, s[:, :1], g)
    with pytest.raises(ValueError, match="swizzled"):
        nvfp4_dequantize(p, s.reshape(-1), g, scale_layout="swizzled")
    with pytest.raises(ValueError, match="scale_layout"):
        nvfp4_dequantize(p, s, g, scale_layout="blocked")
