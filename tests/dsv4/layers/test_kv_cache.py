"""KV storage formats (spec §12: FP8 blocks of 64 over dims [0, nope), rope dims BF16) and the window ring."""
from __future__ import annotations

import pytest
import torch

from dsv4.layers.kv_cache import Bf16KVStorage, Fp8KVStorage, StoredKV, WindowCache
from dsv4.numerics import fp8_fake_quantize_pow2

from .helpers import rand


def test_fp8_storage_quantizes_nope_dims_in_blocks_of_64_and_keeps_rope_bf16():
    st = Fp8KVStorage(192, 64)
    kv = (rand(5, 192, seed=1) * torch.linspace(0.01, 30, 192)).to(torch.bfloat16)
    s = st.encode(kv)
    assert s.parts["nope"].dtype == torch.float8_e4m3fn and s.parts["nope"].shape == (5, 128)
    assert s.parts["scales"].dtype == torch.uint8 and s.parts["scales"].shape == (5, 2)
    back = st.decode(s)
    assert back.dtype == torch.bfloat16
    torch.testing.assert_close(back[:, :128], fp8_fake_quantize_pow2(kv[:, :128], 64), rtol=0, atol=0)
    assert torch.equal(back[:, 128:], kv[:, 128:])
    assert not torch.equal(back[:, :128], kv[:, :128])


def test_bf16_storage_is_exact_and_fp8_needs_64_aligned_nope():
    kv = rand(3, 128, seed=2).to(torch.bfloat16)
    assert torch.equal(Bf16KVStorage(128, 64).roundtrip(kv), kv)
    with pytest.raises(ValueError, match="multiple of 64"):
        Fp8KVStorage(160, 64)


def test_window_ring_keeps_the_last_positions_in_order():
    ring = WindowCache(8)
    rows = torch.arange(20.0)[:, None].repeat(1, 2)
    ring.write(0, StoredKV({"kv": rows[:3]}))
    ring.write(3, StoredKV({"kv": rows[3:14]}))   # a chunk longer than the ring wraps
    ring.write(14, StoredKV({"kv": rows[14:20]}))
    got = ring.recent(5).parts["kv"][:, 0].tolist()
    assert got == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert ring.recent(30).parts["kv"][:, 0].tolist() == [float(p) for p in range(12, 20)]
    with pytest.raises(RuntimeError, match="position 20"):
        ring.write(25, StoredKV({"kv": rows[:1]}))
