"""Swizzled scales whose K/16 is not a multiple of 4 pad the last 4-column K tile, which a block-scaled
MMA multiplies into its product: the contract wants those bytes zero and says so before any launch
(``contract._check_column_padding``); shapes without such padding are not read at all."""
from __future__ import annotations

import pytest
import torch

from dsv4.kernels.contract import FP4Operand, GemmRequest, KernelContractError, _column_padding_mask
from dsv4.numerics.swizzle import swizzle_scales, unswizzle_scales


def swizzled(rows: int, k: int, seed: int = 0, groups: int = 1) -> FP4Operand:
    g = torch.Generator().manual_seed(seed)
    per, sc = rows // groups, k // 16
    lin = (torch.rand(groups, per, sc, generator=g) + 0.5).to(torch.float8_e4m3fn)
    flat = swizzle_scales(lin.view(torch.uint8)).reshape(-1).view(torch.float8_e4m3fn).contiguous()
    gs = torch.ones(groups) if groups > 1 else torch.tensor(1.0)
    return FP4Operand(torch.zeros(rows, k // 2, dtype=torch.uint8), flat, gs, k, "swizzled")


def with_byte(op: FP4Operand, where: int, value: int) -> FP4Operand:
    b = op.scales.view(torch.uint8).clone()
    b[where] = value
    return FP4Operand(op.packed, b.view(torch.float8_e4m3fn), op.global_scale, op.k, "swizzled")


@pytest.mark.parametrize("rows,k", [(130, 80), (64, 48), (256, 112)])
def test_the_mask_is_exactly_the_padded_columns_of_real_rows(rows: int, k: int) -> None:
    sc = k // 16
    mask = _column_padding_mask(rows, sc)
    marked = torch.zeros(rows, sc + (-sc) % 4, dtype=torch.uint8)
    marked[:, sc:] = 1
    assert torch.equal(unswizzle_scales(mask.to(torch.uint8), rows, sc + (-sc) % 4), marked)
    assert int(mask.sum()) == rows * ((-sc) % 4)


def test_a_nonzero_padded_scale_is_one_clear_error() -> None:
    op = swizzled(130, 80)
    op.validate("b")                                     # zero padding, as swizzle_scales writes it
    pad = int(_column_padding_mask(130, 5).nonzero()[7])
    with pytest.raises(KernelContractError, match=r"b.scales padding \(swizzled, K/16 = 5 padded to 8 columns\): "
                                                  r"expected zeros .* found 1 non-zero byte"):
        with_byte(op, pad, 0x7F).validate("b")          # NaN in E4M3
    with_byte(op, pad, 0x80).validate("b")              # -0 is a zero
    a = swizzled(3, 80, seed=1)
    with pytest.raises(KernelContractError, match="b.scales padding"):
        GemmRequest(a, with_byte(op, pad, 0x38)).validate()


def test_per_expert_groups_are_checked_each() -> None:
    op = swizzled(3 * 64, 48, groups=3)
    op.validate("b", groups=3)
    per_group = op.scales.numel() // 3
    pad = int(_column_padding_mask(64, 3).nonzero()[0])
    with pytest.raises(KernelContractError, match="1 non-zero byte"):
        with_byte(op, 2 * per_group + pad, 0x01).validate("b", groups=3)


def test_no_padding_no_read() -> None:
    op = swizzled(130, 64)                               # K/16 = 4: nothing padded along K
    b = op.scales.view(torch.uint8).clone()
    b[-1] = 0x7F                                         # a padded row's byte: never multiplied into an output
    FP4Operand(op.packed, b.view(torch.float8_e4m3fn), op.global_scale, 64, "swizzled").validate("b")
