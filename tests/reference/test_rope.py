"""RoPE (spec §5 step 3, §11): interleaved trailing pairs, θ/YaRN per layer kind, inverse rotation."""
from __future__ import annotations

import math

import torch

from dsv4.config import preset
from reference.rope import RopeSpec, Yarn, apply_rope, cos_sin, inv_freq, rope_spec


def test_interleaved_pairs_on_trailing_dims() -> None:
    spec = RopeSpec(4, 10000.0, None)        # pairs (x4, x5) at ω0 = 1 and (x6, x7) at ω1 = 0.01
    x = torch.tensor([[9.0, 9.0, 9.0, 9.0, 1.0, 0.0, 0.0, 1.0]])
    out = apply_rope(x, cos_sin(spec, torch.tensor([2])))
    assert out[0, :4].tolist() == [9.0] * 4                           # nope dims untouched
    a, b = 2.0, 2.0 * 0.01
    want = [math.cos(a), math.sin(a), -math.sin(b), math.cos(b)]      # u' = u cos − v sin, v' = u sin + v cos
    assert torch.allclose(out[0, 4:], torch.tensor(want), atol=1e-6)


def test_inverse_undoes_the_rotation() -> None:
    spec = rope_spec(preset("tiny"), "csa")
    x = torch.randn(7, 3, 128)
    cs = cos_sin(spec, torch.arange(100, 107))
    assert torch.allclose(apply_rope(apply_rope(x, cs), cs, inverse=True), x, atol=1e-5)


def test_theta_and_yarn_per_layer_kind() -> None:
    c = preset("flash")
    window, csa = rope_spec(c, "window"), rope_spec(c, "csa")
    assert (window.theta, window.yarn) == (10000.0, None)
    assert csa.theta == 160000.0 and csa.yarn == Yarn(16.0, 65536, 32.0, 1.0) and rope_spec(c, "hca") == csa
    base = 1.0 / 160000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)
    f = inv_freq(csa)
    # §11: for θ = 160000, lo = 15 and hi = 25: pairs 0..15 keep ω, pairs >= 25 are divided by 16.
    assert torch.equal(f[:16], base[:16])
    assert torch.allclose(f[25:], base[25:] / 16, rtol=1e-6)
    ramp = (20 - 15) / (25 - 15)
    assert torch.allclose(f[20], base[20] / 16 * ramp + base[20] * (1 - ramp), rtol=1e-6)
    assert torch.equal(inv_freq(window), 1.0 / 10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))


def test_no_yarn_when_original_seq_len_is_zero() -> None:
    assert rope_spec(preset("tiny").replace(original_seq_len=0), "csa").yarn is None
