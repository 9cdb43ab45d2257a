"""Expert banks written group by group (``dsv4/bank_fill.py``, ``weights.prepare_bank``): the same bank
``stack_bank`` makes, element for element, in every format; one clear error for a group unlike the
first; and a group given as a callable read only when its turn comes, the previous one already freed."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from dsv4.bank_fill import BankFill
from dsv4.checkpoint.formats import NVFP4, StoredWeight, WeightFormat
from dsv4.layers.linear import Bf16Weight, Fp4Weight, Fp8Weight, Fp32Weight
from dsv4.numerics import nvfp4_quantize
from dsv4.weights import ConversionRecord, prepare_bank, stack_bank


def fp4(seed: int, n: int = 32, k: int = 64, input_scale: bool = True) -> Fp4Weight:
    g = torch.Generator().manual_seed(seed)
    packed, scales, gs = nvfp4_quantize(torch.randn(n, k, generator=g))
    return Fp4Weight(packed, scales, gs.to(torch.float32).reshape(()),
                     torch.rand((), generator=g) if input_scale else None)


def others(kind: type, seed: int) -> object:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(256, 128, generator=g)
    if kind is Fp8Weight:
        return Fp8Weight(w.to(torch.float8_e4m3fn), torch.randint(100, 140, (2, 1), generator=g, dtype=torch.uint8))
    return kind(w.to(torch.bfloat16) if kind is Bf16Weight else w)


def fill(ws: list) -> object:
    f = BankFill(ws[0], len(ws))
    for i in reversed(range(len(ws))):           # any order: each group has its own slot
        f.put(i, ws[i])
    return f.done()


def same(a: object, b: object) -> None:
    assert type(a) is type(b)
    for k, v in vars(a).items():
        w = getattr(b, k)
        if v is None or w is None:
            assert v is None and w is None, k
        else:
            assert v.dtype == w.dtype and v.shape == w.shape and torch.equal(v.view(torch.uint8), w.view(torch.uint8)), k


@pytest.mark.parametrize("groups", [1, 3, 8])
def test_fp4_bank_is_the_stack(groups: int) -> None:
    ws = [fp4(s) for s in range(groups)]
    same(fill(ws), stack_bank(ws))
    mixed = [fp4(s, input_scale=s != 1) for s in range(3)]     # input scales only if every group has one
    got = fill(mixed)
    same(got, stack_bank(mixed))
    assert got.input_scale is None


@pytest.mark.parametrize("kind", [Fp8Weight, Bf16Weight, Fp32Weight])
def test_other_banks_are_the_stack(kind: type) -> None:
    ws = [others(kind, s) for s in range(4)]
    same(fill(ws), stack_bank(ws))


def test_a_group_unlike_the_first_is_one_clear_error() -> None:
    f = BankFill(fp4(0), 3, "layers.0.ffn.experts.w13")
    with pytest.raises(ValueError, match=r"layers.0.ffn.experts.w13 group 1: packed expected shape/dtype .*32, 32"):
        f.put(1, fp4(1, n=64))
    with pytest.raises(ValueError, match="expected a Fp4Weight like group 0, found Bf16Weight"):
        f.put(2, others(Bf16Weight, 0))
    f.put(0, fp4(0))
    with pytest.raises(ValueError, match="unfilled group index in 0..2, found 0"):
        f.put(0, fp4(0))
    with pytest.raises(ValueError, match=r"groups \[1, 2\] never filled"):
        f.done()


def stored(w: Fp4Weight) -> StoredWeight:
    fmt = WeightFormat(NVFP4, (w.n, w.k), "uint8", (1, 16), "float8_e4m3fn")
    return StoredWeight({"weight": w.packed, "weight_scale": w.scales, "weight_scale_2": w.global_scale}, fmt)


def test_prepare_bank_reads_each_lazy_group_in_turn_and_frees_the_last() -> None:
    """What the builder passes for routed experts: callables. When group i is read, group i-1's stored
    tensors are gone (a bank never on the host whole), and the bank equals the eager one."""
    ws = [fp4(s, input_scale=False) for s in range(5)]
    alive: list[weakref.ref] = []
    order: list[int] = []

    def group(i: int):
        def read() -> list[StoredWeight]:
            gc.collect()
            assert all(r() is None for r in alive), f"group {i - 1}'s tensors still alive when group {i} is read"
            order.append(i)
            sw = stored(Fp4Weight(ws[i].packed.clone(), ws[i].scales.clone(), ws[i].global_scale.clone()))
            alive[:] = [weakref.ref(t) for t in sw.tensors.values()]
            return [sw]
        return read

    recs: list[ConversionRecord] = []
    lazy = prepare_bank([group(i) for i in range(5)], "fp4", name="bank", component="routed_experts", records=recs,
                        device=torch.device("cpu"))
    eager = prepare_bank([[stored(w)] for w in ws], "fp4", name="bank", component="routed_experts", records=recs,
                         device=torch.device("cpu"))
    assert order == [0, 1, 2, 3, 4]
    same(lazy, eager)
    same(lazy, stack_bank(ws))
    assert [r.count for r in recs] == [5, 5] and {r.action for r in recs} == {"as-is"}
    with pytest.raises(ValueError, match="expected at least one group"):
        prepare_bank([], "fp4", name="bank", component="routed_experts", records=recs, device=torch.device("cpu"))
