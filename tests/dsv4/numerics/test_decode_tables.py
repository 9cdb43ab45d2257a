"""The decode tables built once per device hold exactly what the bit-field decode gives."""
from __future__ import annotations

import torch


def test_the_e4m3_decode_table_is_the_bit_field_decode() -> None:
    from dsv4.numerics.e4m3 import e4m3_decode, e4m3_decode_arith

    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert torch.equal(e4m3_decode(b).view(torch.int32), e4m3_decode_arith(b).view(torch.int32))   # NaN bits too
