"""The oracle's recipes assume torch's float32 division, multiplication and reciprocal are IEEE
correctly rounded on the device in use (no fast-math). Double rounding through float64 is
innocuous for these operations (53 >= 2*24 + 2), so float64-then-float32 is the exact reference."""
from __future__ import annotations

import torch


def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-60, 60, (n,), generator=gen).float())
    b = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-60, 60, (n,), generator=gen).float())
    return a, b


def test_float32_div_mul_reciprocal_are_correctly_rounded(device: str) -> None:
    a, b = operands(500_000)
    ad, bd = a.to(device), b.to(device)
    assert torch.equal((ad / bd).cpu(), (a.double() / b.double()).float())
    assert torch.equal((ad * bd).cpu(), (a.double() * b.double()).float())
    one = torch.ones((), device=device)
    assert torch.equal((one / bd).cpu(), (1.0 / b.double()).float())
